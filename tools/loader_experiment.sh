#!/usr/bin/env bash
# tools/loader_experiment.sh: the data-loading experiment of docs/data_loading.md in one command.
#
#   tools/loader_experiment.sh      (75 s on the quiet 2-core dev VM; up to 5 min when it is busy)
#
# 1. builds loader_bench and idx_to_imagefolder (in $KILN_BUILD_DIR, default build/), fetches
#    MNIST if missing and writes it as an ImageFolder of PNGs into datasets/mnist_png/ (once:
#    an existing complete split is kept);
# 2. loader alone: images/s for workers 0,1,2,4,8 on MNIST IDX, the PNG ImageFolder and
#    synthetic data                                        -> out/loader/throughput.csv
# 3. the loader experiment: train the MNIST CNN for $STEPS steps from the PNG ImageFolder,
#    workers 0 vs 2, with the PNG decode alone and with $EXTRA_US us of extra decode work per
#    image (a heavier JPEG), with all cores computing and with one (the others free for the
#    loader, as on a GPU machine)                          -> out/loader/train.csv
#    (LOADER_DEVICE=cuda: on the GPU, plus pinned vs pageable bandwidth -> out/loader/h2d.csv)
# 4. charts (tools/plot.py)                                -> out/loader/*.png
# and prints every figure, and our targets next to what was measured.
#
# Environment: KILN_BUILD_DIR (build tree), LOADER_OUT (default out/loader), LOADER_STEPS
# (default 100), LOADER_EXTRA_US (default 250), LOADER_DEVICE (cpu | cuda, default cpu),
# LOADER_THREADS (compute threads of the training runs, default: all cores).
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
out=${LOADER_OUT:-$root/out/loader}
steps=${LOADER_STEPS:-100}
extra_us=${LOADER_EXTRA_US:-250}
device=${LOADER_DEVICE:-cpu}
threads=${LOADER_THREADS:-$(nproc)}
png=$root/datasets/mnist_png
python=/usr/bin/python3  # Debian's python3-matplotlib (tools/setup.sh, KILN_SETUP_EXTRAS=1)

echo "== loader_experiment: build ($build)"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" --preset release -B "$build" >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target loader_bench idx_to_imagefolder
bench=$build/apps/loader_bench

"$root/datasets/fetch_mnist.sh" >/dev/null
if [[ ! -d "$png/train" || ! -d "$png/test" ]]; then
  echo "== loader_experiment: writing MNIST as PNGs into $png"
  "$build/apps/idx_to_imagefolder" --data "$root/datasets/mnist" --out "$png"
fi
mkdir -p "$out"
# Timings are only as good as the machine is quiet: say how busy it was.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
rm -f "$out"/throughput.csv "$out"/train.csv "$out"/h2d.csv

# Read every PNG once, untimed: the figures are for files in the OS page cache (a warm epoch),
# whichever run comes first. (Cold reads of 60,000 small files measured the disk: 5k images/s.)
find "$png/train" -type f -name '*.png' -exec cat {} + >/dev/null

echo
echo "== loader_experiment: the loader alone (no training)"
"$bench" --mode throughput --format idx --data "$root/datasets/mnist" \
  --batches 1000 --csv "$out/throughput.csv"
"$bench" --mode throughput --format imagefolder --data "$png" \
  --batches 200 --csv "$out/throughput.csv" --append
"$bench" --mode throughput --format synthetic --batches 200 --csv "$out/throughput.csv" --append

echo
echo "== loader_experiment: training the MNIST CNN from PNGs, workers 0 vs 2 ($device)"
"$bench" --mode train --format imagefolder --data "$png" --device "$device" \
  --threads "$threads" --steps "$steps" --workers 0,2 --csv "$out/train.csv"
"$bench" --mode train --format imagefolder --data "$png" --device "$device" \
  --threads "$threads" --steps "$steps" --workers 0,2 --extra-decode-us "$extra_us" \
  --csv "$out/train.csv" --append
if [[ "$device" == cpu* && "$threads" -gt 1 ]]; then
  # One compute thread: on this CPU-only machine one core plays the accelerator and the
  # others are free for the loader, as the host cores of a GPU machine are.
  "$bench" --mode train --format imagefolder --data "$png" --device "$device" \
    --threads 1 --steps "$steps" --workers 0,2 --extra-decode-us "$extra_us" \
    --csv "$out/train.csv" --append
fi
if [[ "$device" == cuda* ]]; then
  echo
  echo "== loader_experiment: host-to-device bandwidth, pageable vs pinned"
  "$bench" --mode h2d --device "$device" --csv "$out/h2d.csv"
fi

echo
echo "== loader_experiment: charts"
"$python" "$root/tools/plot.py" --csv "$out/throughput.csv" --out "$out/throughput.png"
"$python" "$root/tools/plot.py" --csv "$out/train.csv" --out "$out/train.png"
if [[ -f "$out/h2d.csv" ]]; then
  "$python" "$root/tools/plot.py" --csv "$out/h2d.csv" --out "$out/h2d.png"
fi

echo
echo "== loader_experiment: targets"
awk -F, 'NR > 1 && $1 == "idx" && $2 == 2 {
  printf "MNIST IDX loader alone, 2 workers: %.0f images/s (target >= 100000): %s\n",
         $6, ($6 >= 100000 ? "met" : "NOT met") }' "$out/throughput.csv"
awk -F, -v extra="$extra_us" 'NR > 1 {
  sim = ($10 == 1 ? "  SIMULATED" : "")
  printf "train from PNGs%s, %s compute threads, %s workers: loader_wait_fraction %.1f%%, median step %.1f ms, %.0f images/s%s%s\n",
         ($8 > 0 ? " + " $8 " us/image" : ""), $6, $2, 100 * $13, $11, $12,
         ($14 != "" ? sprintf(", device idle %.1f%%", 100 * $14) : ""), sim
  if ($2 == 2) printf "  (target with 2 workers: <= 5%%): %s\n", (100 * $13 <= 5 ? "met" : "NOT met")
}' "$out/train.csv"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
echo "CSV and charts: $out"
