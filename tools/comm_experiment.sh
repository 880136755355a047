#!/usr/bin/env bash
# tools/comm_experiment.sh: the allreduce experiment of docs/data_parallel.md in one command.
#
#   tools/comm_experiment.sh      (about 3 min on the quiet 2-core dev VM)
#
# 1. builds comm_bench (in $KILN_BUILD_DIR, default build/);
# 2. the sweep: ring vs native (MPI_Allreduce) vs hd (halving-doubling) vs bb (binary blocks)
#    vs ps (parameter server, one shard per rank) under `mpirun -np 2`, 4 KiB .. 256 MiB
#                                                        -> out/comm/mpi2.csv
# 3. the bytes check: the same algorithms over local:4 and local:3 threads (3: counts not
#    divisible by N, a non-power-of-two for hd and bb)   -> out/comm/local4.csv, local3.csv
#    and ring vs hd vs bb at one size (4 MiB) over N = 2..16 threads: the bytes of the busiest
#    rank, where hd's fold and bb's blocks differ        -> out/comm/ranks.csv
# 4. the parameter-server bottleneck: ring over W ranks vs PS with W workers + 1 dedicated
#    server, W = 1, 2, 4, 8 on local threads and W = 1, 2, 3 under mpirun -np W+1
#                                                        -> out/comm/ps_scaling_{local,mpi}.csv
# 5. charts (tools/plot.py)                               -> out/comm/*.png; mpi2, ranks and
#    ps_scaling copied to docs/img/comm_*.png (COMM_DOCS_IMG=0: not copied)
# and prints our targets next to what was measured: ring busbw / MPI_Allreduce busbw at
# >= 16 MiB with 2 ranks (target >= 0.9), and bytes per rank = 2(N-1)K/N exactly.
#
# Environment: KILN_BUILD_DIR (build tree), COMM_OUT (default out/comm), COMM_MAX_BYTES
# (default 256M), COMM_ITERS (timed allreduces per size, default 20), COMM_MAX_SECONDS (time
# budget per size and algorithm of the MPI sweep, default 2), COMM_PS_WORKERS (local PS
# scaling, default 1,2,4,8), COMM_PS_BYTES (default 4M), COMM_DOCS_IMG (default 1).
set -euo pipefail
# No arguments: the settings are the environment variables above. -h/--help prints this header.
if [[ $# -gt 0 ]]; then
  if [[ $1 == -h || $1 == --help ]]; then sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
  echo "$(basename "$0"): error: unexpected argument '$1': it takes none (its settings are environment variables: see --help)" >&2
  echo "usage: [VAR=value ...] tools/$(basename "$0")" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KILN_BUILD_DIR:-$root/build}
out=${COMM_OUT:-$root/out/comm}
max_bytes=${COMM_MAX_BYTES:-256M}
iters=${COMM_ITERS:-20}
max_seconds=${COMM_MAX_SECONDS:-2}
ps_workers=${COMM_PS_WORKERS:-1,2,4,8}
ps_bytes=${COMM_PS_BYTES:-4M}
docs_img=${COMM_DOCS_IMG:-1}
python=/usr/bin/python3  # Debian's python3-matplotlib (tools/setup.sh, KILN_SETUP_EXTRAS=1)
# Open MPI refuses to run as root unless told that it is meant (containers, CI).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "== comm_experiment: build ($build)"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" --preset release -B "$build" >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target comm_bench
bench=$build/apps/comm_bench
mkdir -p "$out"
rm -f "$out"/mpi2.csv "$out"/local4.csv "$out"/local3.csv "$out"/ranks.csv "$out"/ps_scaling_local.csv \
  "$out"/ps_scaling_mpi.csv
# Timings are only as good as the machine is quiet: say how busy it was.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"

echo
echo "== comm_experiment: 2 MPI ranks, ring vs native vs hd vs bb vs ps, 4 KiB .. $max_bytes"
mpirun -np 2 "$bench" --dist mpi --allreduce ring,native,hd,bb,ps --min-bytes 4K \
  --max-bytes "$max_bytes" --iters "$iters" --max-seconds "$max_seconds" --csv "$out/mpi2.csv"

echo
echo "== comm_experiment: bytes per rank vs 2(N-1)K/N, local:4 and local:3 threads"
"$bench" --dist local:4 --allreduce ring,hd,bb,ps --min-bytes 4K --max-bytes 16M \
  --iters 5 --csv "$out/local4.csv"
"$bench" --dist local:3 --allreduce ring,hd,bb,ps --min-bytes 4K --max-bytes 16M \
  --iters 5 --csv "$out/local3.csv"

echo
echo "== comm_experiment: ring vs hd vs bb, 4 MiB, N = 2..16 threads (the busiest rank's bytes)"
for n in $(seq 2 16); do
  "$bench" --dist "local:$n" --allreduce ring,hd,bb --min-bytes 4M --max-bytes 4M \
    --iters 20 --csv "$out/ranks.csv" $([[ $n == 2 ]] || echo --append) | grep ' ok$'
done

echo
echo "== comm_experiment: parameter server bottleneck, W workers + 1 server"
"$bench" --dist local --ps-scaling "$ps_workers" --ps-bytes "$ps_bytes" --iters 10 \
  --csv "$out/ps_scaling_local.csv"
for w in 1 2 3; do
  mpirun -np $((w + 1)) --oversubscribe "$bench" --dist mpi --ps-scaling "$w" \
    --ps-bytes "$ps_bytes" --iters 10 --csv "$out/ps_scaling_mpi.csv" --append
done

echo
echo "== comm_experiment: charts"
"$python" "$root/tools/plot.py" --csv "$out/mpi2.csv" --out "$out/mpi2.png" \
  --title "Allreduce over 2 MPI ranks on one host (shared memory), f32"
"$python" "$root/tools/plot.py" --csv "$out/local4.csv" --out "$out/local4.png" \
  --title "Allreduce over 4 threads (local:4), f32"
"$python" "$root/tools/plot.py" --csv "$out/ranks.csv" --out "$out/ranks.png" \
  --title "Ring vs halving-doubling vs binary blocks, 4 MiB f32, N threads (local:N)"
"$python" "$root/tools/plot.py" --csv "$out/ps_scaling_local.csv" --csv "$out/ps_scaling_mpi.csv" \
  --out "$out/ps_scaling.png"
if [[ "$docs_img" == 1 ]]; then
  cp "$out/mpi2.png" "$root/docs/img/comm_mpi2.png"
  cp "$out/ps_scaling.png" "$root/docs/img/comm_ps_scaling.png"
  cp "$out/ranks.png" "$root/docs/img/comm_ranks.png"
  echo "copied to docs/img/comm_mpi2.png, comm_ps_scaling.png and comm_ranks.png"
fi

echo
echo "== comm_experiment: targets"
# Columns: 1 transport,2 world,3 members,4 ps_servers,5 algorithm,6 dtype,7 bytes,8 count,
# 9 iters,10 time_us,11 algbw_gbs,12 busbw_gbs,13 bytes_per_rank,14 bytes_per_rank_max,
# 15 bytes_total,16 model_bytes_per_rank,17 correct,18 median_us
# The target is on busbw from the mean time (nccl-tests' definition); the ratio from the median
# iteration is printed next to it because one stall of a busy machine moves a mean a lot.
tail -n +2 "$out/mpi2.csv" | sort -t, -k7,7n | awk -F, '$7 >= 16777216 {
  bw[$5 "," $7] = $12; med[$5 "," $7] = $7 / ($18 * 1e3) * 2 * ($3 - 1) / $3
  if (!($7 in seen)) { seen[$7] = 1; sizes[++m] = $7 }
}
END {
  n = 0; worst = -1; worst_med = -1
  for (i = 1; i <= m; i++) {
    s = sizes[i]
    if (!(("ring," s) in bw) || !(("native," s) in bw) || bw["native," s] <= 0) continue
    r = bw["ring," s] / bw["native," s]
    rm = med["ring," s] / med["native," s]
    printf "ring / MPI_Allreduce busbw at %d MiB, 2 ranks: %.3f (ring %.2f, native %.2f GB/s); " \
           "from medians %.3f\n", s / 1048576, r, bw["ring," s], bw["native," s], rm
    if (worst < 0 || r < worst) worst = r
    if (worst_med < 0 || rm < worst_med) worst_med = rm
    n++
  }
  if (n == 0) print "ring / MPI_Allreduce at >= 16 MiB: not measured (COMM_MAX_BYTES < 16M?)"
  else printf "ring / MPI_Allreduce busbw at >= 16 MiB, worst size: %.3f (target >= 0.9): %s; " \
              "from medians: %.3f\n", worst, (worst >= 0.9 ? "met" : "NOT met"), worst_med
}'
for f in "$out/mpi2.csv" "$out/local4.csv" "$out/local3.csv" "$out/ranks.csv"; do
  awk -F, -v file="$(basename "$f")" 'NR > 1 && $13 != "" {
    key = $5; total[key]++
    # Exact: the sum over ranks is 2(N-1)K to the byte (the mean is then 2(N-1)K/N).
    if ($15 == 2 * ($3 - 1) * $7) exact[key]++
    if ($14 != $13) uneven[key]++
    if ($17 != 1) wrong[key]++
  }
  END {
    for (k in total)
      printf "%s: %-5s bytes/rank = 2(N-1)K/N exactly at %d of %d sizes%s%s\n", file, k,
             exact[k] + 0, total[k],
             (uneven[k] ? sprintf(" (ranks sent different amounts at %d sizes)", uneven[k]) : ""),
             (wrong[k] ? sprintf("; WRONG results at %d sizes", wrong[k]) : "")
  }' "$f"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
echo "CSV and charts: $out"
