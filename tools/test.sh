#!/usr/bin/env bash
# tools/test.sh: one command from a fresh machine to the full test suite:
# installs dependencies, builds everything, fetches real MNIST (the e2e tests train on it),
# runs every test with ctest. Arguments go to ctest (e.g. -L gradcheck, -R Conv).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KILN_BUILD_DIR:-$root/build}
"$root/tools/setup.sh"
"$root/tools/build.sh"
"$root/datasets/fetch_mnist.sh"
cd "$build"
ctest --output-on-failure --timeout 600 "$@"
