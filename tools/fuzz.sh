#!/usr/bin/env bash
# tools/fuzz.sh: runs the libFuzzer targets of tests/fuzz for a while and says what they found.
#
#   tools/fuzz.sh TARGET SECONDS     TARGET: idx_reader, checkpoint_reader, image_decode,
#                                    device_spec, dist_spec, or all (one after another)
#
# Installs clang and libFuzzer if missing (tools/setup.sh fuzz), configures and builds the fuzz
# tree (preset fuzz: build-fuzz/, or $KILN_FUZZ_BUILD_DIR) when needed, then runs each target for
# SECONDS (-max_total_time) on a temporary working corpus seeded from tests/fuzz/corpus/TARGET,
# and prints one line per target:
#   fuzz: TARGET seconds=S execs=N exec/s=R corpus=INPUTS/BYTES crashes=0|1
# A finding (crash, sanitizer report, leak, timeout over 10 s, out of memory over 2 GB) stops its
# target; the line then names the input that caused it, kept under <build dir>/fuzz-artifacts/,
# libFuzzer's log is printed, and the script exits 1 after the remaining targets. To keep it as
# a regression input: copy it to tests/fuzz/corpus/TARGET/regress_<what>, fix the bug, and the
# ordinary test suite replays it (ctest -L fuzz). Bad usage: exit 2.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
all_targets=(idx_reader checkpoint_reader image_decode device_spec dist_spec)

usage() {
  echo "usage: tools/fuzz.sh TARGET SECONDS   (TARGET: ${all_targets[*]} or all; SECONDS >= 1)" >&2
  exit 2
}
[[ $# -eq 2 ]] || usage
target_arg=$1 seconds=$2
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -ge 1 ]] || { echo "fuzz.sh: SECONDS must be a whole number >= 1, got '$seconds'" >&2; usage; }
if [[ "$target_arg" == all ]]; then
  targets=("${all_targets[@]}")
elif [[ " ${all_targets[*]} " == *" $target_arg "* ]]; then
  targets=("$target_arg")
else
  echo "fuzz.sh: unknown target '$target_arg'" >&2
  usage
fi

build=${KILN_FUZZ_BUILD_DIR:-$root/build-fuzz}
command -v clang++-14 >/dev/null || "$root/tools/setup.sh" fuzz
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" --preset fuzz -B "$build" >/dev/null
fi
exes=()
for t in "${targets[@]}"; do exes+=("fuzz_$t"); done
cmake --build "$build" -j "${KILN_FUZZ_JOBS:-$(nproc)}" --target "${exes[@]}" >/dev/null \
  || { echo "fuzz.sh: building the fuzz tree in $build failed (rerun: cmake --build $build --target ${exes[*]})" >&2; exit 1; }

# KILN_FUZZ_SEED: libFuzzer's -seed (0, the default: a new one each run). A fixed seed fixes the
# first mutations, not a whole run: libFuzzer keeps the inputs that reach new code, and which
# those are differs a little between two runs of one seed (measured: 200,000 inputs of
# device_spec twice with -seed=1 -runs=200000 added 70 and 69 inputs). So a finding is always a
# new input to keep (see above), never proof that the same run would find it again.
seed=${KILN_FUZZ_SEED:-0}
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: KILN_FUZZ_SEED must be a whole number, got '$seed'" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
found=0
for t in "${targets[@]}"; do
  corpus="$work/$t"
  artifacts="$build/fuzz-artifacts/$t"
  log="$build/fuzz-logs/$t.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  cp "$root/tests/fuzz/corpus/$t"/* "$corpus/"
  before=$(date +%s)
  # -timeout: one input running over 10 s is a finding (a hang); -rss_limit_mb: so is a process
  # over 2 GB (-malloc_limit_mb follows it: one allocation over 2 GB). Leaks are findings too.
  status=0
  "$build/tests/fuzz/fuzz_$t" "$corpus" -max_total_time="$seconds" -print_final_stats=1 -seed="$seed" \
    -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$artifacts/" >"$log" 2>&1 || status=$?
  elapsed=$(( $(date +%s) - before ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # libFuzzer's corpus at the end ("corp: 29/209b": inputs it keeps, after reduction), which is
  # fewer than the files in the working directory (a reduced input does not delete its parent).
  corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -1 | sed 's/corp: //')
  artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
  if [[ $status -ne 0 || -n "$artifact" ]]; then
    found=1
    echo "fuzz: $t seconds=$elapsed execs=${execs:-?} exec/s=${rate:-?} corpus=${corp:-?} crashes=1 input=${artifact:-none} (exit $status)"
    echo "---- libFuzzer's log ($log), last 60 lines:"
    tail -n 60 "$log"
    echo "----"
  else
    echo "fuzz: $t seconds=$elapsed execs=$execs exec/s=$rate corpus=$corp crashes=0"
  fi
done
exit $found
