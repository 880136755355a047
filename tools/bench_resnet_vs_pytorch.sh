#!/usr/bin/env bash
# tools/bench_resnet_vs_pytorch.sh: Kiln vs PyTorch (torchvision's models) on ResNet training
# steps and inference, CPU, batch in memory, alternating the programs in one run so machine
# drift hits all of them. Prints every run, then medians and each Kiln / PyTorch-best ratio.
#
#   tools/bench_resnet_vs_pytorch.sh [rounds=3] [threads=2] [device=cpu] [precision=fp32]
#   KILN_BENCH_CSV=out/resnet.csv tools/bench_resnet_vs_pytorch.sh   (also writes the medians;
#   /usr/bin/python3 tools/plot.py --csv out/resnet.csv --out resnet.png draws them)
#
# precision bf16 or fp16 (CPU): every Kiln and PyTorch run under autocast (Kiln's --precision,
# torch.autocast("cpu")). With device cuda[:N] (a GPU machine, e.g. from tools/gpu_check.sh):
# ResNet-50 training at 128x128, batch 32, on the GPU, in FP32 with TF32 off and on, then bf16
# and fp16 autocast (PyTorch AMP, with its GradScaler for fp16), Kiln against PyTorch in the
# same mode (cudnn.benchmark on for PyTorch, as its users run it). PYTHON overrides the command that
# runs PyTorch (default /usr/bin/python3; words are split, so `env VAR=... python3` works).
#
# Workloads (the image size and batch of the model-parallel ResNet-50 tutorial's benchmark):
#   resnet50 train 128x128 batch 32, resnet18 train 128x128 batch 32, resnet50 eval 128x128
#   batch 32.
# PyTorch runs in three setups, and Kiln is compared with the best of them per workload:
#   default           torch threads = N, OpenBLAS threads = 1 (otherwise two pools fight);
#   tuned             + glibc malloc told never to give memory back (MALLOC_MMAP_THRESHOLD_ and
#                     MALLOC_TRIM_THRESHOLD_ at 16 GiB): no page faults on every step's buffers;
#   tuned+nhwc        + torch.channels_last for model and input (oneDNN without reorders).
# Kiln runs its defaults (channel-blocked activations, direct convolutions) and, for the 3x3
# convolutions, oneDNN's Winograd (--winograd; eval also with BatchNorm folded, --fold-bn).
# Needs a build (tools/build.sh) and Debian's python3-torch and python3-torchvision
# (KILN_SETUP_EXTRAS=1 tools/setup.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench=${KILN_BUILD_DIR:-$root/build}/apps/train_step_bench
rounds=${1:-3}
threads=${2:-2}
device=${3:-cpu}
precision=${4:-fp32}
usage() {
  echo "tools/bench_resnet_vs_pytorch.sh: error: $1" >&2
  echo "usage: tools/bench_resnet_vs_pytorch.sh [rounds=3] [threads=2] [device=cpu|cuda|cuda:N] [precision=fp32|bf16|fp16]" >&2
  exit 2
}
[[ $# -le 4 ]] || usage "at most 4 arguments, got $#"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage "rounds must be a whole number >= 1 (got $rounds)"
[[ $threads =~ ^[1-9][0-9]*$ ]] || usage "threads must be a whole number >= 1 (got $threads)"
[[ $device =~ ^(cpu|cuda(:[0-9]+)?)$ ]] || usage "device must be cpu, cuda or cuda:N (got $device)"
[[ $precision =~ ^(fp32|bf16|fp16)$ ]] || usage "precision must be one of fp32, bf16, fp16 (got $precision)"
read -r -a python <<<"${PYTHON:-/usr/bin/python3}"
[[ -x "$bench" ]] || { echo "missing $bench: run tools/build.sh first" >&2; exit 2; }
"${python[@]}" -c "import torch, torchvision" 2>/dev/null || {
  echo "PyTorch/torchvision not found for ${python[*]}: run KILN_SETUP_EXTRAS=1 tools/setup.sh" >&2
  exit 2
}
tuned=(MALLOC_MMAP_THRESHOLD_=17179869184 MALLOC_TRIM_THRESHOLD_=17179869184)
common=(--threads "$threads" --batch-size 32 --image-size 128 --steps 8 --warmup 3 --precision "$precision")

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# run LABEL COMMAND...: runs it, names its line LABEL (e.g. "pytorch[tuned]"), logs and prints it.
run() {
  local label=$1
  shift
  "$@" | sed "s/^\(kiln\|pytorch\) /$label /" | tee -a "$log"
}
if [[ "$device" == cuda* ]]; then
  gcommon=(--model resnet50 --mode train --device "$device" --batch-size 32 --image-size 128 --steps 20 --warmup 5)
  for r in $(seq "$rounds"); do
    echo "== round $r of $rounds ($device)"
    for math in "" "--precision tf32" "--precision bf16" "--precision fp16"; do
      run kiln "$bench" "${gcommon[@]}" $math
      run "pytorch[cudnn.benchmark]" "${python[@]}" "$root/tools/bench_pytorch_step.py" "${gcommon[@]}" $math
    done
  done
  "${python[@]}" - "$log" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(kiln|pytorch)\S* model=\w+ mode=\w+\+?(\S*) .*images_per_sec=([\d.]+)", line)
    if m:
        runs.setdefault((m[1], m[2] or "fp32"), []).append(float(m[3]))
print("resnet50 train on the GPU (batch 32, 128x128, median img/s):")
for math in ("fp32", "tf32", "bf16", "fp16"):
    k, p = runs.get(("kiln", math)), runs.get(("pytorch", math))
    if k and p:
        k, p = statistics.median(k), statistics.median(p)
        print(f"  {math}: kiln {k:.1f}, pytorch {p:.1f}, kiln/pytorch = {k / p:.2f}x")
PY
  exit 0
fi
for r in $(seq "$rounds"); do
  echo "== round $r of $rounds"
  for w in "resnet50 train" "resnet18 train" "resnet50 eval"; do
    set -- $w
    model=$1 mode=$2
    k=(env OMP_NUM_THREADS="$threads" "$bench" --model "$model" --mode "$mode" "${common[@]}")
    p=(env OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS=1)
    py=("${python[@]}" "$root/tools/bench_pytorch_step.py" --model "$model" --mode "$mode" "${common[@]}")
    run kiln "${k[@]}"
    run "pytorch[default]" "${p[@]}" "${py[@]}"
    run kiln "${k[@]}" --winograd
    run "pytorch[tuned]" "${p[@]}" "${tuned[@]}" "${py[@]}"
    [[ $mode == eval ]] && run kiln "${k[@]}" --winograd --fold-bn
    run "pytorch[tuned+nhwc]" "${p[@]}" "${tuned[@]}" "${py[@]}" --channels-last
  done
done
echo
"${python[@]}" - "$log" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(kiln|pytorch\[[\w+]+\]) model=(\w+) mode=(\w+)([\w+]*) .*images_per_sec=([\d.]+)", line)
    if not m:
        continue
    who, model, mode, variant, ips = m.groups()
    if who == "kiln":
        who = "kiln" + (f"[{variant.lstrip('+')}]" if variant else "[default]")
    runs.setdefault((model, mode), {}).setdefault(who, []).append(float(ips))
import csv, os
out = os.environ.get("KILN_BENCH_CSV")
rows = []
for (model, mode), by in runs.items():
    med = {who: statistics.median(v) for who, v in by.items()}
    rows += [{"workload": f"{model} {mode}", "runner": who, "images_per_sec": f"{v:.1f}"}
             for who, v in sorted(med.items(), key=lambda kv: (kv[0].startswith("pytorch"), kv[0]))]
    best_pt = max((v, w) for w, v in med.items() if w.startswith("pytorch"))
    print(f"{model} {mode} (batch 32, 128x128, median img/s over {len(next(iter(by.values())))} runs):")
    for who in sorted(med):
        print(f"  {who:28s} {med[who]:7.1f}")
    for who in sorted(w for w in med if w.startswith("kiln")):
        print(f"  {who} / {best_pt[1]} = {med[who] / best_pt[0]:.2f}x")
if out:
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["workload", "runner", "images_per_sec"])
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}")
PY
