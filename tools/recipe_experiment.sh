#!/usr/bin/env bash
# tools/recipe_experiment.sh: mnist_train's default recipe against --recipe fast, the figures of
# docs/training_recipes.md.
#
#   tools/recipe_experiment.sh            3 runs of each recipe (seeds 1..3), alternating
#   RECIPE_RUNS=5 tools/recipe_experiment.sh
#
# Every run evaluates on the full test set after each epoch (mnist_train does) and writes its
# JSON summary; from the per-epoch test accuracy and training seconds (the training loops
# only, evaluation excluded) the script takes, for each recipe, the median over the runs of
#   - the epochs and the training seconds until the test accuracy first reaches 99.0%
#   - the final test accuracy and the total training seconds.
# The runs alternate (default, fast, default, fast, ...) so that a change in the machine's load
# falls on both recipes alike. Outputs, in $RECIPE_OUT (default out/recipe):
#   runs.csv      recipe,run,seed,epoch,train_seconds,test_accuracy (cumulative seconds)
#   accuracy.png  test accuracy vs training seconds, every run (tools/plot.py)
#   schedules.png learning rate vs step of the fast recipe's one-cycle and of a cyclic schedule
#   run_<recipe>_<seed>.json / .log
# Environment: KILN_BUILD_DIR (build tree, default build/), RECIPE_RUNS (default 3),
# RECIPE_OUT, RECIPE_THREADS (default: all cores), RECIPE_EXTRA_FLAGS (added to both recipes,
# e.g. "--limit-train 6000 --limit-test 1000" for a quick check of the script itself).
# Takes 3 x (6 + 3) epochs of training: on a quiet 2-core CPU about half an hour or more.
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
out=${RECIPE_OUT:-$root/out/recipe}
runs=${RECIPE_RUNS:-3}
threads=${RECIPE_THREADS:-$(nproc)}
extra=${RECIPE_EXTRA_FLAGS:-}
python=/usr/bin/python3  # Debian's python3-matplotlib (tools/setup.sh, KILN_SETUP_EXTRAS=1)

echo "== recipe_experiment: build ($build)"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" --preset release -B "$build" >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target mnist_train >/dev/null
train=$build/apps/mnist_train
"$root/datasets/fetch_mnist.sh" >/dev/null
mkdir -p "$out"

for ((i = 1; i <= runs; ++i)); do
  for recipe in default fast; do
    echo "== run $i/$runs: --recipe $recipe --seed $i"
    # shellcheck disable=SC2086
    "$train" --recipe "$recipe" --seed "$i" --threads "$threads" $extra \
      --json "$out/run_${recipe}_$i.json" > "$out/run_${recipe}_$i.log" 2>&1 ||
      { cat "$out/run_${recipe}_$i.log"; exit 1; }
    grep -E "^epoch|^test accuracy|^recipe" "$out/run_${recipe}_$i.log" || true
  done
done

"$python" - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
rows, summary = [], {}
for recipe in ("default", "fast"):
    for i in range(1, runs + 1):
        j = json.load(open("%s/run_%s_%d.json" % (out, recipe, i)))
        secs, total, reached = j["train_seconds_per_epoch"], 0.0, None
        for e, (s, acc) in enumerate(zip(secs, j["test_accuracy_per_epoch"])):
            total += s
            rows.append((recipe, i, j["seed"], e + 1, total, acc))
            if reached is None and acc >= 0.99:
                reached = (e + 1, total)
        summary.setdefault(recipe, []).append(
            dict(epochs=j["epochs"], final=j["test_accuracy"], seconds=total, reached=reached,
                 optimizer=j["optimizer"], batch=j["batch_size"], schedule=j["lr_schedule"]["name"]))
with open(out + "/runs.csv", "w") as f:
    f.write("recipe,run,seed,epoch,train_seconds,test_accuracy\n")
    for r in rows:
        f.write("%s,%d,%d,%d,%.3f,%.6f\n" % r)
med = statistics.median
print("== recipe_experiment: medians over %d runs (training seconds exclude evaluation)" % runs)
print("%-8s %-28s %6s %9s %18s %18s" % ("recipe", "setup", "epochs", "final acc",
                                         "epochs to 99.0%", "seconds to 99.0%"))
for recipe, s in summary.items():
    hit = [x["reached"] for x in s if x["reached"]]
    ep = "%g" % med([h[0] for h in hit]) if hit else "-"
    sec = "%.1f" % med([h[1] for h in hit]) if hit else "-"
    if hit and len(hit) < len(s):
        ep += " (%d/%d runs)" % (len(hit), len(s))
    setup = "%s, batch %d, %s" % (s[0]["optimizer"], s[0]["batch"], s[0]["schedule"])
    print("%-8s %-28s %6d %8.2f%% %18s %18s   (all epochs: %.1f s)" % (
        recipe, setup, s[0]["epochs"], 100 * med([x["final"] for x in s]), ep, sec,
        med([x["seconds"] for x in s])))
    for i, x in enumerate(s, 1):
        print("    seed %d: final %.2f%%, 99.0%% %s" % (
            i, 100 * x["final"], "after epoch %d, %.1f s" % x["reached"] if x["reached"]
            else "not reached"))
PY

"$python" "$root/tools/plot.py" --csv "$out/runs.csv" --out "$out/accuracy.png"
"$python" "$root/tools/plot.py" --lr-schedules --out "$out/schedules.png"
echo "== recipe_experiment: wrote $out/runs.csv, $out/accuracy.png, $out/schedules.png"
