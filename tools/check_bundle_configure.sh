#!/usr/bin/env bash
# tools/check_bundle_configure.sh: the GPU bundle (tools/gpu_bundle.sh) alone is enough to
# configure Kiln, as on a GPU machine that has none of Debian's -dev packages.
#
#   tools/check_bundle_configure.sh
#
# 1. The list: every package tools/setup.sh installs is carried by the bundle or named in its
#    not_carried list with the reason (tools/gpu_bundle.sh packages / not-carried), and
#    not_carried names nothing the bundle carries or setup.sh does not install.
# 2. The bundle: the carried packages' .deb files, as `tools/gpu_bundle.sh make` downloads them
#    (apt-get download, same versions), kept in build-lint/bundle-debs/ (KILN_BUNDLE_CACHE) and
#    downloaded again only when a version changes; unpacked by `tools/gpu_bundle.sh unpack` into
#    a temporary directory (KILN_GPU_BUNDLE_DIR). MNIST is not part of this check.
# 3. The configure: cmake -S . with only the bundle's env.sh arguments and the machine's /usr
#    hidden from every find_package/find_path/find_library (-DCMAKE_IGNORE_PREFIX_PATH=/usr:
#    what the GPU machine lacks is then lacking here too; its compiler is still used). The
#    CUDA backend is off: the bundle carries none of CUDA (the GPU machine has its toolkit);
#    so is MPI, which the bundle leaves out (optional: not_carried says why).
#    Configure only, no build. It fails if the configure fails, or if a dependency was found
#    outside the bundle anyway.
# Seconds once the .deb files are cached (8 s on 2 cores; 20 MB to download the first time).
# Exit codes: 0 the bundle configures Kiln; 1 it does not (or the list is inconsistent, or a
# download failed); 2 bad usage.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ $# -gt 0 ]]; then
  echo "check_bundle_configure.sh: takes no arguments (got: $*); see the top of tools/check_bundle_configure.sh" >&2
  exit 2
fi
cache=${KILN_BUNDLE_CACHE:-$root/build-lint/bundle-debs}
say() { echo "check_bundle_configure.sh: $*"; }
fail() { echo "check_bundle_configure.sh: FAILED: $*" >&2; exit 1; }

# ---- 1. the list ----------------------------------------------------------------------------
mapfile -t setup_pkgs < <("$root/tools/setup.sh" list)
mapfile -t carried < <(bash "$root/tools/gpu_bundle.sh" packages)
mapfile -t not_carried < <(bash "$root/tools/gpu_bundle.sh" not-carried | cut -d: -f1)
in_list() { local x=$1; shift; local y; for y in "$@"; do [[ "$x" == "$y" ]] && return 0; done; return 1; }
problems=()
for p in "${setup_pkgs[@]}"; do
  in_list "$p" "${carried[@]}" || in_list "$p" "${not_carried[@]}" ||
    problems+=("tools/setup.sh installs $p, which tools/gpu_bundle.sh neither carries (packages) nor leaves out with a reason (not_carried)")
done
for p in "${not_carried[@]}"; do
  in_list "$p" "${carried[@]}" && problems+=("tools/gpu_bundle.sh both carries $p and lists it in not_carried")
  in_list "$p" "${setup_pkgs[@]}" || problems+=("tools/gpu_bundle.sh's not_carried names $p, which tools/setup.sh does not install")
done
if ((${#problems[@]})); then
  printf '  %s\n' "${problems[@]}" >&2
  fail "the GPU bundle's package list and tools/setup.sh disagree"
fi
say "package list: ${#carried[@]} carried, ${#not_carried[@]} of tools/setup.sh's left out with a reason"

# ---- 2. the bundle --------------------------------------------------------------------------
command -v apt-get >/dev/null 2>&1 || fail "apt-get is not installed: the bundle is made from Debian 12's packages"
mkdir -p "$cache"
# 'URI' file size SHA256:hash, one line per package: the exact files apt-get download fetches.
uris=$(apt-get download --print-uris "${carried[@]}" 2>&1) ||
  fail "apt-get download --print-uris failed (stale package lists? run 'apt-get update' as root):
$uris"
wanted=() fetch=()
while read -r _ file size hash; do
  [[ "$file" == *.deb ]] || continue
  wanted+=("$file")
  if [[ -f "$cache/$file" && "$(stat -c %s "$cache/$file")" == "$size" &&
        ( "$hash" != SHA256:* || "$(sha256sum "$cache/$file" | cut -d' ' -f1)" == "${hash#SHA256:}" ) ]]; then
    continue
  fi
  fetch+=("${file%%_*}")
done <<<"$uris"
[[ ${#wanted[@]} -eq ${#carried[@]} ]] ||
  fail "apt-get knows ${#wanted[@]} of the bundle's ${#carried[@]} packages: $(printf '%s ' "${carried[@]}")"
if ((${#fetch[@]})); then
  say "downloading ${#fetch[@]} package(s) into $cache: ${fetch[*]}"
  chmod 0777 "$cache" 2>/dev/null || true  # apt-get download fetches as the _apt user when run as root
  (cd "$cache" && apt-get download -q "${fetch[@]}" >"$cache/apt.log" 2>&1) ||
    { tail -n 5 "$cache/apt.log" >&2; fail "apt-get download failed"; }
fi
# Older versions of the same packages: no longer the bundle's.
for f in "$cache"/*.deb; do
  [[ -e "$f" ]] || continue
  in_list "$(basename "$f")" "${wanted[@]}" || rm -f "$f"
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bundle-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bundle/debs"
for f in "${wanted[@]}"; do
  ln "$cache/$f" "$tmp/bundle/debs/$f" 2>/dev/null || cp "$cache/$f" "$tmp/bundle/debs/$f"
done
if ! KILN_GPU_BUNDLE_DIR="$tmp/bundle" bash "$root/tools/gpu_bundle.sh" unpack >"$tmp/unpack.log" 2>&1; then
  sed 's/^/  /' "$tmp/unpack.log" >&2
  fail "tools/gpu_bundle.sh unpack failed on the bundle's own packages (above)"
fi
say "unpacked ${#wanted[@]} packages into a temporary bundle"

# ---- 3. the configure -----------------------------------------------------------------------
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
set +u
# shellcheck disable=SC1091  # written by gpu_bundle.sh unpack just above
source "$tmp/bundle/env.sh"
set -u
start=$SECONDS
if ! cmake -S "$root" -B "$tmp/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=OFF \
       -DCMAKE_IGNORE_PREFIX_PATH=/usr -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
       "${KILN_BUNDLE_CMAKE_ARGS[@]}" >"$tmp/configure.log" 2>&1; then
  sed 's/^/  /' "$tmp/configure.log" >&2
  fail "Kiln does not configure against the GPU bundle alone (cmake output above): a package the build needs is missing from tools/gpu_bundle.sh's list"
fi
# Every library, header and CMake package found in the bundle, none elsewhere (the compiler's
# own OpenMP and threads aside).
outside=$(grep -E '^[A-Za-z0-9_]+(_LIBRARY|_LIBRARIES|_INCLUDE_DIR|_INCLUDE_DIRS|_DIR)(:[A-Z]+)?=/' "$tmp/build/CMakeCache.txt" |
          grep -vE "^(OpenMP_|Threads_|CMAKE_|[A-Za-z0-9_]+_(BINARY|SOURCE)_DIR)" | grep -v "=$KILN_BUNDLE_ROOT/" || true)
if [[ -n "$outside" ]]; then
  printf '  %s\n' "$outside" >&2
  fail "Kiln configured, but with dependencies from outside the GPU bundle (above)"
fi
say "Kiln configures against the GPU bundle alone, /usr hidden ($((SECONDS - start)) s): every dependency found in the bundle"
