#!/usr/bin/env bash
# tools/dp_experiment.sh: the data-parallel targets, side by side in one run.
#
#   tools/dp_experiment.sh            (about 10 min on the 2-core dev VM: 6 epochs, twice)
#
# Trains the default mnist_train (MNIST CNN, Adadelta, global batch 128, 6 epochs) twice on this
# machine: 1 rank x 1 thread, then `mpirun -np 2` ranks x 1 thread (--dist mpi, each rank a
# batch of 64 and half of the data), and prints images/s of both, their ratio (target >= 1.8x),
# the test accuracies (target >= 99.0%), overlap_fraction (target > 0.5), communication
# seconds and bytes sent per rank. JSON summaries go to $DP_OUT (default out/dp).
#
# Environment: KILN_BUILD_DIR (build tree, default build/), DP_OUT, DP_EPOCHS (default 6),
# DP_ARGS (extra mnist_train flags for both runs, e.g. "--limit-train 20000").
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
out=${DP_OUT:-$root/out/dp}
epochs=${DP_EPOCHS:-6}
read -r -a extra <<< "${DP_ARGS:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" --preset release -B "$build" >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target mnist_train >/dev/null
mkdir -p "$out"
app=$build/apps/mnist_train
common=(--threads 1 --epochs "$epochs" -q "${extra[@]}")

echo "== dp_experiment: 1 rank x 1 thread"
"$app" "${common[@]}" --json "$out/one_rank.json"
echo "== dp_experiment: mpirun -np 2, 1 thread per rank"
mpirun -np 2 "$app" --dist mpi "${common[@]}" --json "$out/mpi2.json"

/usr/bin/python3 - "$out/one_rank.json" "$out/mpi2.json" <<'PY'
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[1:3])
r = two["train_images_per_sec"] / one["train_images_per_sec"]
print(f"1 rank : {one['train_images_per_sec']:7.0f} img/s, test accuracy {100*one['test_accuracy']:.2f}%")
print(f"2 ranks: {two['train_images_per_sec']:7.0f} img/s, test accuracy {100*two['test_accuracy']:.2f}%, "
      f"overlap_fraction {two['overlap_fraction']:.2f}, comm {two['comm_seconds']:.1f} s "
      f"(exposed {two['exposed_comm_seconds']:.1f} s), {two['bytes_sent_per_rank']/1e9:.2f} GB sent per rank, "
      f"replicas equal: {two['replicas_equal']}")
print(f"speed-up 2 ranks / 1 rank: {r:.2f}x (target >= 1.8x)")
PY
