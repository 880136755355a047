#!/usr/bin/env bash
# tools/rank_death.sh: one rank of a data-parallel mnist_train run dies mid-run; how fast do
# the other ranks stop, and do they say which rank died? One row per transport:
#
#   transport  dead rank  survivors' exit s  named correctly  exit code
#   local      1          0:0.01 2:0.01      yes              1
#
#   tools/rank_death.sh [--transports local,mpi,nccl] [--dead-rank R] [--step S] [--check]
#
#   local  mnist_train --dist local:3, KILN_FAULT="rank=R,step=S": rank R's thread throws at its
#          S-th step (comm/fault_injection.h). Times are from the "KILN_FAULT:" line to each
#          survivor's "mnist_train: rank r: error:" line.
#   mpi    mpirun -np 3 mnist_train --dist mpi; once training runs (MPI_KILL_AFTER seconds after
#          the header, default 2), rank R's process is sent SIGKILL from outside, as the OOM
#          killer would. Times are from the kill to each survivor's process being gone (polled
#          every 20 ms). Skipped (with the reason) when mpirun is missing or the build has no MPI.
#   nccl   mnist_train --dist nccl:3 (three simulated GPUs: a build with KILN_CUDA_SIM; skipped
#          otherwise), KILN_FAULT as for local; a smaller run (the MLP), the simulator is slow.
#
# "named correctly": every survivor printed an error line that names rank R as the dead rank
# ("rank R failed", or "rank R (pid ...) ... has died"). --check exits 1 unless every row is
# named correctly, every survivor stopped within 30 s and the run's exit code says it failed
# (local, nccl: 1; mpi: mpirun's, non-zero). Each run's output is kept in $RANK_DEATH_OUT
# (default out/rank_death/<transport>.log). Exit 77 (ctest's skip) when MNIST is missing or every
# transport asked for was skipped; 2 for a bad argument.
#
# Environment: KILN_BUILD_DIR (default build/, else build-sim/), MNIST_DIR (default
# datasets/mnist), MPIEXEC (default mpirun), MPI_KILL_AFTER, RANK_DEATH_OUT.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
transports=local,mpi,nccl
dead=1
step=5
check=0
while [ $# -gt 0 ]; do
  case $1 in
    --transports) transports=$2; shift 2 ;;
    --dead-rank) dead=$2; shift 2 ;;
    --step) step=$2; shift 2 ;;
    --check) check=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "rank_death.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$dead" -lt 0 ] || [ "$dead" -gt 2 ]; then
  echo "rank_death.sh: --dead-rank must be 0, 1 or 2 (the runs have 3 ranks)" >&2; exit 2
fi
build=${KILN_BUILD_DIR:-}
if [ -z "$build" ]; then
  build=$root/build
  [ -x "$build/apps/mnist_train" ] || build=$root/build-sim
fi
train=$build/apps/mnist_train
data=${MNIST_DIR:-$root/datasets/mnist}
mpiexec=${MPIEXEC:-mpirun}
kill_after=${MPI_KILL_AFTER:-2}
out=${RANK_DEATH_OUT:-$root/out/rank_death}
limit=30  # seconds: what "every survivor stops promptly" means here
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ ! -x "$train" ]; then
  echo "rank_death.sh: no mnist_train at $train: build it (cmake --build <tree> --target mnist_train) or set KILN_BUILD_DIR" >&2
  exit 2
fi
if [ ! -f "$data/train-images-idx3-ubyte" ]; then
  echo "rank_death.sh: skipped: no MNIST in $data: run datasets/fetch_mnist.sh or set MNIST_DIR" >&2
  exit 77  # ctest: SKIP_RETURN_CODE
fi
mkdir -p "$out"
survivors=$(for r in 0 1 2; do [ "$r" -ne "$dead" ] && printf '%s ' "$r"; done)
rows=()
failed=0

now() { date +%s.%N; }
seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# Prefixes each line with the time it arrived.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }

# Rank r's line names the dead rank: local/nccl "rank R failed", mpi "rank R (pid P ...".
names_dead() {  # log rank
  grep -E "(mnist_train: rank $2: error:|kiln: rank $2/3 \([a-z]+\): stopped by SIGTERM)" "$1" |
    grep -qE "rank $dead failed|rank $dead \(pid [0-9]+"
}

add_row() {  # transport times named rc expected_rc_ok
  local ok=$5
  rows+=("$(printf '%-9s  %-9s  %-24s  %-15s  %s' "$1" "$dead" "$2" "$3" "$4")")
  if [ "$check" -eq 1 ]; then
    [ "$3" = yes ] || { echo "FAIL $1: a survivor's error does not name rank $dead" >&2; failed=1; }
    [ "$ok" -eq 1 ] || { echo "FAIL $1: exit code $4 does not say that the run failed" >&2; failed=1; }
    for t in $2; do
      awk -v s="${t#*:}" -v l="$limit" 'BEGIN { exit !(s == "-" || s >= l) }' &&
        { echo "FAIL $1: survivor ${t%%:*} took ${t#*:} s (limit $limit s)" >&2; failed=1; }
    done
  fi
}

# Ranks as threads: KILN_FAULT makes rank $dead throw at step $step.
run_threads() {  # transport dist [extra flags...]
  local transport=$1 dist=$2; shift 2
  local log=$out/$transport.log
  echo "== $transport: mnist_train --dist $dist, KILN_FAULT=rank=$dead,step=$step" >&2
  KILN_FAULT="rank=$dead,step=$step" "$train" --dist "$dist" --data "$data" --limit-test 1000 \
    --epochs 1 --threads 1 --batch-size 96 "$@" 2>&1 | stamp >"$log"
  local rc=${PIPESTATUS[0]}
  local fault times="" named=yes
  fault=$(awk '/KILN_FAULT: rank/ { print $1; exit }' "$log")
  if [ -z "$fault" ]; then
    echo "rank_death.sh: $transport: the fault never fired (the run has fewer than $step steps?)" >&2
    add_row "$transport" "-" no "$rc" 0
    return
  fi
  for r in $survivors; do
    local at
    at=$(awk -v r="$r" '$0 ~ ("mnist_train: rank " r ": error:") { print $1; exit }' "$log")
    times+="$r:$([ -n "$at" ] && seconds "$fault" "$at" || echo -) "
    names_dead "$log" "$r" || named=no
  done
  add_row "$transport" "${times% }" "$named" "$rc" "$([ "$rc" -eq 1 ] && echo 1 || echo 0)"
}

run_mpi() {
  local log=$out/mpi.log
  if ! command -v "$mpiexec" >/dev/null; then
    echo "== mpi: skipped: $mpiexec not found (apt-get install openmpi-bin)" >&2
    rows+=("$(printf '%-9s  %s' mpi "skipped: $mpiexec not found")"); return
  fi
  if ! ldd "$train" 2>/dev/null | grep libmpi >/dev/null; then
    echo "== mpi: skipped: $train was built without MPI" >&2
    rows+=("$(printf '%-9s  %s' mpi "skipped: built without MPI")"); return
  fi
  echo "== mpi: mpirun -np 3 mnist_train --dist mpi; SIGKILL to rank $dead after ${kill_after} s of training" >&2
  "$mpiexec" -np 3 --oversubscribe "$train" --dist mpi --data "$data" --limit-train 30000 \
    --limit-test 1000 --epochs 2 --threads 1 --batch-size 96 > >(stamp >"$log") 2>&1 &
  local mpirun_pid=$!
  local waited=0
  until grep -q "data parallel:" "$log" 2>/dev/null; do
    sleep 0.1; waited=$((waited + 1))
    if [ "$waited" -gt 600 ] || ! kill -0 "$mpirun_pid" 2>/dev/null; then
      echo "rank_death.sh: mpi: the run did not start (see $log)" >&2
      kill "$mpirun_pid" 2>/dev/null; wait "$mpirun_pid" 2>/dev/null
      add_row mpi "-" no "-" 0; return
    fi
  done
  sleep "$kill_after"
  # mpirun's children are the ranks; Open MPI puts each one's rank in its environment.
  declare -A pid_of
  local p r
  for p in $(pgrep -P "$mpirun_pid"); do
    r=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$r" ] && pid_of[$r]=$p
  done
  if [ -z "${pid_of[$dead]:-}" ]; then
    echo "rank_death.sh: mpi: rank $dead's process not found (did the run end already? see $log)" >&2
    wait "$mpirun_pid"; add_row mpi "-" no "$?" 0; return
  fi
  local killed_at
  killed_at=$(now)
  kill -KILL "${pid_of[$dead]}"
  echo "   SIGKILL sent to rank $dead (pid ${pid_of[$dead]}) at $killed_at" >&2
  declare -A gone_at
  local deadline
  deadline=$(awk -v t="$killed_at" -v l="$limit" 'BEGIN { printf "%.3f", t + l + 30 }')
  while :; do
    local left=0
    for r in $survivors; do
      [ -n "${gone_at[$r]:-}" ] && continue
      if [ -z "${pid_of[$r]:-}" ] || ! kill -0 "${pid_of[$r]}" 2>/dev/null ||
         [ "$(awk '{ print $3 }' "/proc/${pid_of[$r]}/stat" 2>/dev/null)" = Z ]; then
        gone_at[$r]=$(now)
      else
        left=1
      fi
    done
    [ "$left" -eq 0 ] && break
    if awk -v d="$deadline" -v t="$(now)" 'BEGIN { exit !(t > d) }'; then
      echo "rank_death.sh: mpi: survivors still running $((limit + 30)) s after the kill: ending the job" >&2
      kill "$mpirun_pid"; break
    fi
    sleep 0.02
  done
  wait "$mpirun_pid"
  local rc=$?
  sleep 0.2  # the stamping reader drains the last lines
  local times="" named=yes
  for r in $survivors; do
    times+="$r:$([ -n "${gone_at[$r]:-}" ] && seconds "$killed_at" "${gone_at[$r]}" || echo -) "
    names_dead "$log" "$r" || named=no
  done
  add_row mpi "${times% }" "$named" "$rc" "$([ "$rc" -ne 0 ] && echo 1 || echo 0)"
}

IFS=, read -ra wanted <<<"$transports"
for t in "${wanted[@]}"; do
  case $t in
    local) run_threads local local:3 --limit-train 6000 ;;
    mpi) run_mpi ;;
    nccl)
      if ! grep -q "KILN_CUDA_SIM:BOOL=ON" "$build/CMakeCache.txt" 2>/dev/null; then
        echo "== nccl: skipped: $build is not a simulator build (cmake --preset sim)" >&2
        rows+=("$(printf '%-9s  %s' nccl "skipped: needs the simulator build")")
        continue
      fi
      KILN_SIM_DEVICES=3 run_threads nccl nccl:3 --model mlp --limit-train 3000 ;;
    *) echo "rank_death.sh: unknown transport '$t' (local, mpi, nccl)" >&2; exit 2 ;;
  esac
done

printf '%-9s  %-9s  %-24s  %-15s  %s\n' transport "dead rank" "survivors' exit s" \
  "named correctly" "exit code"
printf '%s\n' "${rows[@]}"
echo "(survivors' exit s: rank:seconds from the fault to the rank's error line (threads) or to its process ending (mpi); logs in $out)"
ran=$(printf '%s\n' "${rows[@]}" | grep -vc "skipped:")
[ "$failed" -eq 0 ] && [ "$ran" -eq 0 ] && exit 77  # every transport asked for was skipped
exit $failed
