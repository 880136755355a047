#!/usr/bin/env bash
# tools/soak.sh: does a long training run stay flat? Builds and runs the soak test
# (tests/soak/soak_test.cpp: 2 data-parallel ranks, the MNIST CNN, loaders abandoned mid-epoch
# again and again) and prints its figures: resident memory after epoch 1 and after the last,
# the growth in %, the CPU allocator's reserve, peak and bytes in use, and threads and open
# descriptors before and after. Exit code 0 when everything stayed flat (growth < 5%, no thread
# or descriptor left behind), 1 otherwise.
#
#   tools/soak.sh                      the long version (ctest label soak: 12 epochs)
#   tools/soak.sh --epochs 30 --examples 4096 --exits 8
#
# The build tree is $KILN_BUILD_DIR (default build-cpu, preset cpu).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${KILN_BUILD_DIR:-$root/build-cpu}
epochs=12 examples=2048 exits=8
while [[ $# -gt 0 ]]; do
  case $1 in
    --epochs) epochs=$2; shift 2 ;;
    --examples) examples=$2; shift 2 ;;
    --exits) exits=$2; shift 2 ;;
    *) echo "tools/soak.sh: unknown argument $1 (use --epochs N, --examples N, --exits N)" >&2
       exit 2 ;;
  esac
done
if [[ ! -f "$dir/CMakeCache.txt" ]]; then
  cmake -S "$root" --preset cpu -B "$dir" >/dev/null
fi
cmake --build "$dir" -j "${KILN_JOBS:-2}" --target soak_test >/dev/null
log=$(mktemp "${TMPDIR:-/tmp}/kiln-soak.XXXXXX")
trap 'rm -f "$log"' EXIT
rc=0
KILN_SOAK_EPOCHS=$epochs KILN_SOAK_EXAMPLES=$examples KILN_SOAK_EXITS=$exits \
  "$dir/tests/soak/soak_test" >"$log" 2>&1 || rc=$?
grep '^soak:' "$log" || { cat "$log"; echo "tools/soak.sh: the soak test printed no figures" >&2; exit 1; }
if [[ $rc -ne 0 ]]; then
  grep -E 'Failure|grew|left' "$log" >&2 || cat "$log" >&2
  echo "tools/soak.sh: NOT flat (see above)" >&2
  exit 1
fi
echo "tools/soak.sh: flat"
