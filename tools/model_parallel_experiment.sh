#!/usr/bin/env bash
# tools/model_parallel_experiment.sh: the model-parallel experiment of docs/model_parallel.md
# in one command (about 7 minutes on a quiet 2-core machine).
#
# 1. builds resnet_bench (in $KILN_BUILD_DIR, default build/);
# 2. resnet_bench with its defaults on cpu:0,cpu:1 (one core each): one device on one core and
#    on both, naive model parallelism, GPipe at every split size, the measured bubble of the
#    best split, and peak activation memory per stage (GPipe, 1F1B, re-materialisation)
#                                               -> out/model_parallel/bench.{csv,json,log}
#                                                  and trace.json (the best split's step)
# 3. hybrid data x pipeline: 2 replicas x 2 stages as threads, then as `mpirun -np 2` processes
#    (narrow nets, small: they show it works and its overlap, not speed)
#                                               -> out/model_parallel/hybrid_{local,mpi}.json
# 4. charts (tools/plot.py)                     -> out/model_parallel/*.png, copied to
#    docs/img/model_parallel_{bench,gantt}.png (MP_DOCS_IMG=0: not copied)
#
# Environment: KILN_BUILD_DIR, MP_OUT (default out/model_parallel), MP_ARGS (extra resnet_bench
# flags, e.g. "--balance tutorial"), MP_DOCS_IMG (default 1).
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
out=${MP_OUT:-$root/out/model_parallel}
docs_img=${MP_DOCS_IMG:-1}
python=/usr/bin/python3  # Debian's python3-matplotlib (tools/setup.sh, KILN_SETUP_EXTRAS=1)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "== model_parallel_experiment: build ($build)"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" --preset release -B "$build" >/dev/null
fi
cmake --build "$build" --target resnet_bench -j "$(nproc)" >/dev/null
mkdir -p "$out"
bench=$build/apps/resnet_bench

echo "== resnet_bench (defaults; ${MP_ARGS:-no extra flags})"
# shellcheck disable=SC2086
"$bench" --devices cpu:0,cpu:1 ${MP_ARGS:-} --csv "$out/bench.csv" --json "$out/bench.json" \
  --trace "$out/trace.json" | tee "$out/bench.log"

echo "== hybrid: 2 replicas x 2 stages, threads"
tiny=(--model resnet50 --width 16 --image-size 64 --batch-size 16 --steps 2 --repeats 3
      --modes pipeline --split-sizes 4)
"$bench" "${tiny[@]}" --devices cpu:0,cpu:1 --dp 2 --threads-per-stage 1 \
  --json "$out/hybrid_local.json" | tail -6
if command -v mpirun >/dev/null; then
  echo "== hybrid: 2 replicas x 2 stages, mpirun -np 2"
  mpirun -np 2 --oversubscribe "$bench" "${tiny[@]}" --devices cpu:0,cpu:1 \
    --threads-per-stage 1 --json "$out/hybrid_mpi.json" | tail -5
fi

echo "== charts"
if "$python" -c "import matplotlib" 2>/dev/null; then
  "$python" "$root/tools/plot.py" --csv "$out/bench.csv" --out "$out/bench.png"
  "$python" "$root/tools/plot.py" --trace "$out/trace.json" --out "$out/gantt.png" \
    --title "the best split's step: one row per stage"
  if [[ "$docs_img" == 1 ]]; then
    cp "$out/bench.png" "$root/docs/img/model_parallel_bench.png"
    cp "$out/gantt.png" "$root/docs/img/model_parallel_gantt.png"
  fi
else
  echo "no matplotlib for $python: charts skipped (apt-get install python3-matplotlib)"
fi
