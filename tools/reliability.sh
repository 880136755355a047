#!/usr/bin/env bash
# tools/reliability.sh: Kiln's reliability checks, short versions, in one table
# (docs/reliability.md explains each guarantee and how it is tested).
#
#   tools/reliability.sh [--long] [--sanitizers]
#
#   fuzz            tools/fuzz.sh all S: every libFuzzer target for S seconds (30; --long: 600),
#                   executions, executions per second, final corpus, crashes
#   sanitizers      the last ctest run of the ASan + UBSan tree (build-asan) and of the
#                   ThreadSanitizer tree (build-tsan): tests passed and failed, and when.
#                   --sanitizers first runs both trees (tools/test.sh; about 25 minutes on
#                   2 cores)
#   kill-and-resume tools/kill_resume.sh K: K SIGKILLs (5; --long: 20), resumed each time;
#                   identical checkpoints and final weights
#   rank death      tools/rank_death.sh: one rank of three dies mid-run; survivors' exit
#                   seconds per transport (local, mpi, and nccl in a simulator build) and
#                   whether they named the dead rank
#   soak            tools/soak.sh: two ranks, loaders abandoned mid-epoch; growth of resident
#                   memory and of the allocator's reserve after epoch 1, threads and descriptors
#                   (4 epochs; --long: 12)
#
# Environment: KILN_BUILD_DIR (a CPU or default tree for kill-and-resume and soak; default
# build-cpu), KILN_SIM_BUILD_DIR (the rank-death runs, which need the simulator for nccl;
# default build-sim, else KILN_BUILD_DIR), KILN_SANITIZER_ROOT (the tree whose build-asan and
# build-tsan are read; default this one). Each check's full output goes to
# out/reliability/<check>.log. Exit 0 when every check passed, 1 otherwise, 2 on bad usage.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
long=0 sanitizers=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --long) long=1; shift ;;
    --sanitizers) sanitizers=1; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "tools/reliability.sh: unknown argument '$1' (use --long, --sanitizers)" >&2; exit 2 ;;
  esac
done
fuzz_seconds=30 kills=5 soak_epochs=4
(( long )) && fuzz_seconds=600 kills=20 soak_epochs=12
build=${KILN_BUILD_DIR:-$root/build-cpu}
sim_build=${KILN_SIM_BUILD_DIR:-$root/build-sim}
[[ -x "$sim_build/apps/mnist_train" ]] || sim_build=$build
logs=$root/out/reliability
mkdir -p "$logs"
rows=()
failed=0
row() { rows+=("$(printf '%-28s %s' "$1" "$2")"); }

# Builds what the checks run in a CPU tree (configured with preset cpu when missing).
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" --preset cpu -B "$build" >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target mnist_train checkpoint_tool >/dev/null \
  || { echo "tools/reliability.sh: building mnist_train in $build failed" >&2; exit 1; }
[[ -x "$sim_build/apps/mnist_train" ]] || sim_build=$build

echo "== fuzz: every target for $fuzz_seconds s" >&2
if "$root/tools/fuzz.sh" all "$fuzz_seconds" >"$logs/fuzz.log" 2>&1; then :; else failed=1; fi
while read -r _ target rest; do
  # fuzz: TARGET seconds=S execs=N exec/s=R corpus=INPUTS/BYTES crashes=C
  declare -A f=()
  for kv in $rest; do f[${kv%%=*}]=${kv#*=}; done
  row "fuzz $target" "${f[seconds]} s, ${f[execs]} executions (${f[exec/s]}/s), final corpus ${f[corpus]} (inputs/bytes), crashes ${f[crashes]}"
  unset f
done < <(grep '^fuzz: ' "$logs/fuzz.log")
grep -q '^fuzz: ' "$logs/fuzz.log" || row "fuzz" "did not run: see $logs/fuzz.log"

if (( sanitizers )); then
  echo "== sanitizers: tools/test.sh, trees asan and tsan" >&2
  KILN_TEST_TREES=asan,tsan "$root/tools/test.sh" >"$logs/sanitizers.log" 2>&1 || failed=1
fi
# The last ctest run of a tree: LastTest.log holds one "Test Passed." / "Test Failed." per test
# and the time it ended.
sanitizer_root=${KILN_SANITIZER_ROOT:-$root}
for tree in asan tsan; do
  log=$sanitizer_root/build-$tree/Testing/Temporary/LastTest.log
  name="sanitizer $tree"; [[ $tree == asan ]] && name="sanitizer asan+ubsan"
  if [[ -f "$log" ]]; then
    passed=$(grep -c '^Test Passed\.' "$log") failed_n=$(grep -c '^Test Failed\.' "$log")
    ended=$(grep -m1 '^End testing:' "$log" | sed 's/^End testing: //')
    row "$name" "$passed passed, $failed_n failed (build-$tree, run ${ended:-unfinished})"
    (( failed_n == 0 )) || failed=1
  else
    row "$name" "no run yet (tools/reliability.sh --sanitizers, or tools/test.sh)"
  fi
done

echo "== kill-and-resume: $kills kills" >&2
KILN_BUILD_DIR=$build "$root/tools/kill_resume.sh" "$kills" >"$logs/kill_resume.log" 2>&1 || failed=1
verdict=$(grep -m1 '^kill-and-resume:' "$logs/kill_resume.log")
row "kill-and-resume" "${verdict#kill-and-resume: }"

echo "== rank death: local, mpi, nccl" >&2
KILN_BUILD_DIR=$sim_build RANK_DEATH_OUT=$logs/rank_death \
  "$root/tools/rank_death.sh" --transports local,mpi,nccl --check >"$logs/rank_death.log" 2>&1 || failed=1
# Table rows: transport, dead rank, survivors' times (rank:seconds ...), named, exit code; or
# transport and "skipped: why".
while read -r transport dead_rank rest; do
  case $transport in local|mpi|nccl) ;; *) continue ;; esac
  if [[ $dead_rank == skipped:* ]]; then row "rank death $transport" "$dead_rank $rest"; continue; fi
  read -r -a fields <<<"$rest"
  n=${#fields[@]}
  named=${fields[n-2]} code=${fields[n-1]} times=${fields[*]:0:n-2}
  row "rank death $transport" "rank $dead_rank died; survivors stopped after (rank:s) $times; named it: $named; exit $code"
done < <(sed -n '/^transport /,/^(survivors/p' "$logs/rank_death.log")

echo "== soak: $soak_epochs epochs" >&2
KILN_BUILD_DIR=$build "$root/tools/soak.sh" --epochs "$soak_epochs" >"$logs/soak.log" 2>&1 || failed=1
while read -r line; do row "soak" "${line#soak: }"; done < <(grep '^soak:' "$logs/soak.log")

echo
echo "Kiln reliability checks ($( ((long)) && echo long || echo short ) versions; logs in $logs)"
printf '%-28s %s\n' check result
printf '%s\n' "${rows[@]}"
if (( failed )); then
  echo "reliability: FAILED (see the logs above)"
  exit 1
fi
echo "reliability: all checks passed"
