#!/usr/bin/env bash
# mpi_rank_dies_test.sh <mpiexec> <mpi_rank_dies binary> kill|abort: rank 1 leaves the job
# (SIGKILL, or Transport::abort) while rank 0 waits for it (see mpi_rank_dies.cpp). Passes when
# the job ends within 30 s, with a non-zero exit code and a message saying what happened
# (after a SIGKILL: rank 0's own line naming rank 1).
# Prints who ended the job: Open MPI's launcher (expected) or our transport's timeout.
set -u
mpiexec=$1
binary=$2
mode=$3
log=$(mktemp)
trap 'rm -f "$log"' EXIT

start=$(date +%s.%N)
"$mpiexec" -np 2 --oversubscribe "$binary" "$mode" >"$log" 2>&1
rc=$?
end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
cat "$log"
echo "---- mpi_rank_dies $mode: exit code $rc after $elapsed s"

fail=0
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the job exited 0 although rank 1 left it"; fail=1
fi
if awk -v e="$elapsed" 'BEGIN { exit !(e >= 30) }'; then
  echo "FAIL: the job took $elapsed s to end (limit 30 s)"; fail=1
fi
# What ended the job. (Open MPI's banners, "MPI_ABORT was invoked" and "mpirun noticed that
# process rank 1 ... exited on signal 9", are not reliable: its launcher sometimes loses them
# while tearing the job down. Hence our abort() line and mpirun's exit code as evidence.)
# Rank 0 shares the host with rank 1: it must say itself that rank 1 died (its liveness check
# while it waits, or its SIGTERM report if the launcher's signal came first).
if [ "$mode" = kill ] &&
   ! grep -qE "rank 1 \(pid [0-9]+ on this host\) has died|SIGTERM after rank 1 \(pid [0-9]+\)" "$log"; then
  echo "FAIL: rank 0 did not name rank 1 as dead"; fail=1
fi
if grep -q "has died" "$log"; then
  echo "ended by: rank 0's liveness check (rank 1's process is gone) and its abort()"
elif grep -q "did not complete within" "$log"; then
  echo "ended by: the mpi transport's timeout on rank 0"
elif [ "$mode" = kill ] && grep -q "exited on signal 9" "$log"; then
  echo "ended by: Open MPI's launcher (mpirun noticed that rank 1 died)"
elif [ "$mode" = kill ] && [ "$rc" -eq 137 ]; then
  echo "ended by: Open MPI's launcher (exit code 137: a rank died of signal 9; its banner was lost)"
elif [ "$mode" = abort ] && grep -q "rank 1/2 (mpi) on .* aborts the job: rank 1 gives up" "$log"; then
  echo "ended by: rank 1's abort() (MPI_Abort: Open MPI killed the other ranks)"
else
  echo "FAIL: no message says that rank 1 died or aborted, or that rank 0 timed out"; fail=1
fi
exit $fail
