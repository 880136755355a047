#!/usr/bin/env bash
# tools/model_parallel_experiment.sh: the model-parallel experiment of docs/model_parallel.md
# in one command (tens of minutes on a quiet 2-core machine: every split size runs each schedule).
#
# 1. builds resnet_bench (in $KILN_BUILD_DIR, default build/);
# 2. resnet_bench with its defaults (ResNet-50, 64x64 images, batch 120) on cpu:0,cpu:1 (one
#    core each): one device on one core and on both, naive model parallelism, and every
#    schedule of $MP_SCHEDULES (GPipe, 1F1B, zero bubble ZB-H1 and ZB-H2, interleaved 1F1B with
#    2 chunks per device) at every split size, alternating within each repeat; per schedule the
#    measured bubble of its best split beside the ideal one, and peak activation memory per
#    stage (every schedule, and GPipe with re-materialisation)
#                                               -> out/model_parallel/bench.{csv,json,log}
#                                                  and trace_<schedule>.json (its best split's step)
# 3. the same schedules over 4 stages, cpu:0..cpu:3, one thread each, at two split sizes. The
#    machine has 2 cores, so the 4 stage threads share them: this run is about the measured
#    bubble against the formula (and the schedules' shapes in the Gantt charts), not about speed
#                                               -> out/model_parallel/bench4.{csv,json,log}
#                                                  and trace4_<schedule>.json
# 4. hybrid data x pipeline: 2 replicas x 2 stages as threads, then as `mpirun -np 2` processes
#    (narrow nets, small: they show it works and its overlap, not speed)
#                                               -> out/model_parallel/hybrid_{local,mpi}.json
# 5. charts (tools/plot.py)                     -> out/model_parallel/*.png (bench, bench4,
#    gantt_<schedule>, gantt4_<schedule>); bench.png and gantt_gpipe.png copied to
#    docs/img/model_parallel_{bench,gantt}.png (MP_DOCS_IMG=0: not copied)
#
# Environment: KILN_BUILD_DIR, MP_OUT (default out/model_parallel), MP_ARGS (extra resnet_bench
# flags of the 2-stage run, e.g. "--balance tutorial"), MP4_ARGS (the 4-stage run's flags
# besides devices and schedules; default "--split-sizes 8,20 --steps 1 --repeats 2"),
# MP_SCHEDULES (default gpipe,1f1b,zb-h1,zb-h2,interleaved), MP_DOCS_IMG (default 1).
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

schedules=${MP_SCHEDULES:-gpipe,1f1b,zb-h1,zb-h2,interleaved}
rm -f "$out"/trace*.json  # the charts below draw every trace there: none left from older runs
echo "== resnet_bench (defaults, --schedule $schedules; ${MP_ARGS:-no extra flags})"
# shellcheck disable=SC2086
"$bench" --devices cpu:0,cpu:1 --schedule "$schedules" --chunks 2 ${MP_ARGS:-} \
  --csv "$out/bench.csv" --json "$out/bench.json" --trace "$out/trace.json" | tee "$out/bench.log"

echo "== resnet_bench: 4 stages on cpu:0..cpu:3 (2 cores: the bubble against the formula, not speed)"
# shellcheck disable=SC2086
"$bench" --devices cpu:0,cpu:1,cpu:2,cpu:3 --threads-per-stage 1 --modes pipeline \
  --schedule "$schedules" --chunks 2 ${MP4_ARGS:---split-sizes 8,20 --steps 1 --repeats 2} \
  --csv "$out/bench4.csv" --json "$out/bench4.json" --trace "$out/trace4.json" | tee "$out/bench4.log"

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
  "$python" "$root/tools/plot.py" --csv "$out/bench4.csv" --out "$out/bench4.png" \
    --title "4 stages on 2 cores (cpu:0..cpu:3, one thread each): step time per schedule"
  # One trace per schedule (a single schedule writes the --trace name itself).
  for tag in "" 4; do
    for trace in "$out/trace${tag}"_*.json "$out/trace${tag}.json"; do
      [[ -f "$trace" ]] || continue
      name=$(basename "$trace" .json)
      name=${name#trace"${tag}"}
      "$python" "$root/tools/plot.py" --trace "$trace" --out "$out/gantt${tag}${name}.png" \
        --title "${name#_}${name:+: }the best split's step, one row per stage"
    done
  done
  if [[ "$docs_img" == 1 ]]; then
    cp "$out/bench.png" "$root/docs/img/model_parallel_bench.png"
    gantt=$out/gantt_gpipe.png
    [[ -f "$gantt" ]] || gantt=$out/gantt.png
    cp "$gantt" "$root/docs/img/model_parallel_gantt.png"
  fi
else
  echo "no matplotlib for $python: charts skipped (apt-get install python3-matplotlib)"
fi
