#!/usr/bin/env bash
# tools/build.sh: configures (the release preset of CMakePresets.json) and builds Kiln in build/.
# Extra arguments go to CMake's configure step, e.g. tools/build.sh -DKILN_CUDA=OFF
# KILN_BUILD_TARGET=<target> builds only that target (default: everything).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KILN_BUILD_DIR:-$root/build}
cmake -S "$root" --preset release -B "$build" "$@"
cmake --build "$build" -j "$(nproc)" --target "${KILN_BUILD_TARGET:-all}"
