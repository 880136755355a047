#!/usr/bin/env bash
# tools/check_headers_alone.sh: every Kiln header compiles on its own, with clang 16 and libc++
# built with -D_LIBCPP_REMOVE_TRANSITIVE_INCLUDES: a header that uses a standard name whose
# header it does not include fails here even where libstdc++ happens to pull that header in.
#
#   tools/check_headers_alone.sh [HEADER...]   (default: every *.h and *.cuh under engine/
#                                               layers/ comm/ data/ models/ apps/ tests/ examples/)
#
# Each header H is compiled as a one-line translation unit, `#include "H"`, with
#   clang++-16 -std=c++17 -stdlib=libc++ -D_LIBCPP_REMOVE_TRANSITIVE_INCLUDES -fsyntax-only
# (libc++'s switch that drops the includes its headers make only for compatibility:
# https://libcxx.llvm.org/DesignDocs/HeaderRemovalPolicy.html), two headers at a time.
#
# What is compiled, and why:
#   * -DKILN_WITH_CUDA=1 -DKILN_CUDA_SIM=1: the configuration of the simulator build (preset
#     sim), in which every header of Kiln is used, engine/cuda/ included; the CUDA runtime, cuBLAS,
#     cuDNN and NCCL declarations then come from the simulator (engine/cuda/sim/), so no CUDA
#     toolkit is needed. Under nvcc the same headers include the toolkit's instead; what a header
#     uses of the standard library does not change with that.
#   * A *.cuh (device code: __device__, __global__) is included after engine/cuda/runtime.h,
#     as every .cu file that uses it does.
#   * The macros that tests/CMakeLists.txt defines for the test programs that include a header
#     (KILN_SOURCE_DIR, KILN_MNIST_TRAIN: tests/apps/mnist_train_runner.h) get stand-in values.
#   * Dependencies come from Debian's packages (tools/setup.sh): gtest, nlohmann-json, CLI11,
#     oneDNN, OpenBLAS's cblas.h (-I its directory, as CMake finds it), stb.
# Needs clang-16, libc++-16-dev and libc++abi-16-dev (tools/setup.sh lint installs them).
# Exit codes: 0 every header compiles alone; 1 some do not (their errors are printed); 2 bad
# usage (a HEADER that is not a header of the tree, no clang++-16).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cxx=${KILN_CLANGXX:-clang++-16}
command -v "$cxx" >/dev/null 2>&1 ||
  { echo "check_headers_alone.sh: $cxx not found: tools/setup.sh lint installs clang-16 and libc++ 16" >&2; exit 2; }

if [[ $# -gt 0 ]]; then
  headers=()
  for h in "$@"; do
    h=${h#./}
    [[ -f "$h" && ( "$h" == *.h || "$h" == *.cuh ) ]] ||
      { echo "check_headers_alone.sh: $h: not a header (*.h, *.cuh) of the tree (paths are relative to $root)" >&2; exit 2; }
    headers+=("$h")
  done
else
  mapfile -t headers < <(find engine layers comm data models apps tests examples \
                           \( -name '*.h' -o -name '*.cuh' \) -type f | LC_ALL=C sort)
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-headers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export KILN_CXX=$cxx KILN_TMP=$tmp
# compile_one <header>: prints nothing and succeeds, or prints the header and its errors.
compile_one() {
  local h=$1 tu
  tu="$KILN_TMP/$(echo "$h" | tr '/.' '__').cpp"
  {
    [[ "$h" == *.cuh ]] && echo '#include "engine/cuda/runtime.h"'
    echo "#include \"$h\""
  } >"$tu"
  if ! out=$("$KILN_CXX" -std=c++17 -stdlib=libc++ -D_LIBCPP_REMOVE_TRANSITIVE_INCLUDES -fsyntax-only \
               -DKILN_WITH_CUDA=1 -DKILN_CUDA_SIM=1 \
               -DKILN_SOURCE_DIR='"."' -DKILN_MNIST_TRAIN='"mnist_train"' -I. -Itests -Iexamples/custom_layer \
               -I/usr/include/x86_64-linux-gnu/openblas-openmp -I/usr/include/stb \
               -Wno-unknown-warning-option "$tu" 2>&1); then
    printf '== %s does not compile alone:\n%s\n' "$h" "$out"
    return 1
  fi
}
export -f compile_one
start=$SECONDS
if printf '%s\0' "${headers[@]}" | xargs -0 -n 1 -P "${KILN_JOBS:-2}" bash -c 'compile_one "$1"' _ >"$tmp/log"; then
  echo "check_headers_alone.sh: every header compiles alone, ${#headers[@]} of ${#headers[@]} (clang 16, libc++ without transitive includes, $((SECONDS - start)) s)"
  exit 0
fi
cat "$tmp/log"
echo "check_headers_alone.sh: $(grep -c '^== ' "$tmp/log") of ${#headers[@]} headers do not compile alone (see above)" >&2
exit 1
