#!/usr/bin/env bash
# tools/bench_resnet_vs_pytorch.sh: Kiln vs PyTorch (torchvision's models) on ResNet training
# steps and inference, batch in memory, alternating the programs in one run so machine drift
# hits all of them. Prints every run, then medians and each Kiln / PyTorch-best ratio.
#
#   tools/bench_resnet_vs_pytorch.sh [rounds=3] [threads=2] [device=cpu] [precision] [workload]
#   KILN_BENCH_CSV=out/resnet.csv tools/bench_resnet_vs_pytorch.sh   (also writes the medians;
#   /usr/bin/python3 tools/plot.py --csv out/resnet.csv --out resnet.png draws them)
#
# workload: IMAGE:BATCH, the input's height and width and the batch: 128:32 (the default, the
# image size and batch of the model-parallel ResNet-50 tutorial's benchmark) or 224:128
# (ImageNet's size at a training batch); on cuda a comma-separated list, e.g. 128:32,224:128.
# PYTHON overrides the command that runs PyTorch (default /usr/bin/python3; words are split, so
# `env VAR=... python3` works).
#
# CPU (the default device). precision fp32 (the default), bf16 or fp16: every Kiln and PyTorch
# run under autocast (Kiln's --precision, torch.autocast("cpu")). Workloads: resnet50 train,
# resnet18 train, resnet50 eval. PyTorch runs in three setups, and Kiln is compared with the
# best of them per workload:
#   default           torch threads = N, OpenBLAS threads = 1 (otherwise two pools fight);
#   tuned             + glibc malloc told never to give memory back (MALLOC_MMAP_THRESHOLD_ and
#                     MALLOC_TRIM_THRESHOLD_ at 16 GiB): no page faults on every step's buffers;
#   tuned+nhwc        + torch.channels_last for model and input (oneDNN without reorders).
# Kiln runs its defaults (channel-blocked activations, direct convolutions), channels-last
# activations (--memory-format channels_last) and, for the 3x3 convolutions, oneDNN's Winograd
# (--winograd; eval also with BatchNorm folded, --fold-bn).
#
# device cuda[:N] (a GPU machine, e.g. from tools/gpu_check.sh): ResNet-50 training on the GPU,
# for each precision (a comma-separated list of fp32 = TF32 off, tf32, bf16 and fp16 autocast
# (PyTorch AMP, with its GradScaler for fp16); default: all four) and each workload, every
# round running in turn:
#   kiln              train_step_bench, eager (each op launched as it comes);
#   kiln-nhwc         the same with channels-last activations (--memory-format channels_last);
#   pytorch           PyTorch eager, NCHW, cudnn.benchmark on (as its users run it);
#   kiln-graph        train_step_bench --cuda-graph: the whole step captured once into a CUDA
#                     graph after the warm-up steps, then replayed;
#   pytorch-nhwc      PyTorch eager, channels_last;
#   pytorch-compile   PyTorch torch.compile(mode="reduce-overhead") (Inductor's kernels replayed
#                     as CUDA graphs), channels_last.
# KILN_BENCH_RUNNERS=kiln,pytorch (a comma-separated list) runs some of them only. The PyTorch
# runs are one process (bench_pytorch_step.py --serve) that keeps each setup between rounds, so
# torch.compile compiles each precision and workload once; its warm-up (compilation, the CUDA
# graphs' recording) is untimed, as Kiln's. Prints each configuration's medians as it ends and
# the ratios kiln[graph] / the best PyTorch eager setup and kiln[graph] / pytorch[compile+nhwc];
# KILN_BENCH_JSON=FILE also writes them as JSON (rewritten after each configuration).
# KILN_BENCH_SECONDS=S: start no configuration that would, at the pace of the slowest so far,
# end after S seconds (those left out are named at the end).
# Needs a build (tools/build.sh) and Debian's python3-torch and python3-torchvision
# (KILN_SETUP_EXTRAS=1 tools/setup.sh); on cuda, PyTorch 2 for pytorch-compile.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench=${KILN_BUILD_DIR:-$root/build}/apps/train_step_bench
rounds=${1:-3}
threads=${2:-2}
device=${3:-cpu}
precision=${4:-}
workload=${5:-128:32}
usage() {
  echo "tools/bench_resnet_vs_pytorch.sh: error: $1" >&2
  echo "usage: tools/bench_resnet_vs_pytorch.sh [rounds=3] [threads=2] [device=cpu|cuda|cuda:N] [precision=fp32|bf16|fp16 (cuda: also tf32, a list, all)] [workload=IMAGE:BATCH (cuda: a list), e.g. 128:32 or 224:128]" >&2
  exit 2
}
[[ $# -le 5 ]] || usage "at most 5 arguments, got $#"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage "rounds must be a whole number >= 1 (got $rounds)"
[[ $threads =~ ^[1-9][0-9]*$ ]] || usage "threads must be a whole number >= 1 (got $threads)"
[[ $device =~ ^(cpu|cuda(:[0-9]+)?)$ ]] || usage "device must be cpu, cuda or cuda:N (got $device)"
if [[ $device == cpu ]]; then
  precision=${precision:-fp32}
  [[ $precision =~ ^(fp32|bf16|fp16)$ ]] || usage "precision must be one of fp32, bf16, fp16 (got $precision)"
  [[ $workload =~ ^[1-9][0-9]*:[1-9][0-9]*$ ]] || usage "workload must be IMAGE:BATCH, e.g. 128:32 (got $workload)"
else
  [[ -z $precision || $precision == all ]] && precision=fp32,tf32,bf16,fp16
  [[ $precision =~ ^(fp32|tf32|bf16|fp16)(,(fp32|tf32|bf16|fp16))*$ ]] ||
    usage "precision must be fp32, tf32, bf16, fp16, a comma-separated list of them, or all (got $precision)"
  [[ $workload =~ ^[1-9][0-9]*:[1-9][0-9]*(,[1-9][0-9]*:[1-9][0-9]*)*$ ]] ||
    usage "workload must be IMAGE:BATCH or a comma-separated list of them, e.g. 128:32,224:128 (got $workload)"
  runners=${KILN_BENCH_RUNNERS:-kiln,pytorch,kiln-graph,pytorch-nhwc,kiln-nhwc,pytorch-compile}
  [[ $runners =~ ^(kiln|kiln-graph|kiln-nhwc|pytorch|pytorch-nhwc|pytorch-compile)(,(kiln|kiln-graph|kiln-nhwc|pytorch|pytorch-nhwc|pytorch-compile))*$ ]] ||
    usage "KILN_BENCH_RUNNERS must be a comma-separated list of kiln, kiln-graph, kiln-nhwc, pytorch, pytorch-nhwc, pytorch-compile (got $runners)"
  seconds=${KILN_BENCH_SECONDS:-0}
  [[ $seconds =~ ^[0-9]+$ ]] || usage "KILN_BENCH_SECONDS must be whole seconds (got $seconds)"
fi
read -r -a python <<<"${PYTHON:-/usr/bin/python3}"
[[ -x "$bench" ]] || { echo "missing $bench: run tools/build.sh first" >&2; exit 2; }
"${python[@]}" -c "import torch, torchvision" 2>/dev/null || {
  echo "PyTorch/torchvision not found for ${python[*]}: run KILN_SETUP_EXTRAS=1 tools/setup.sh" >&2
  exit 2
}
tuned=(MALLOC_MMAP_THRESHOLD_=17179869184 MALLOC_TRIM_THRESHOLD_=17179869184)
image=${workload%%:*} batch=${workload##*:}
common=(--threads "$threads" --batch-size "$batch" --image-size "$image" --steps 8 --warmup 3 --precision "$precision")

log=$(mktemp)
jdir=$(mktemp -d)
trap 'rm -rf "$log" "$jdir"' EXIT
# run LABEL COMMAND...: runs it, names its line LABEL (e.g. "pytorch[tuned]"), logs and prints it.
run() {
  local label=$1
  shift
  "$@" | sed "s/^\(kiln\|pytorch\) /$label /" | tee -a "$log"
}

if [[ "$device" == cuda* ]]; then
  trap '' PIPE  # a PyTorch process that died fails the write to it, not this script
  # summarize LOG JSON_DIR [IMAGE:BATCH PRECISION]: the medians, the Kiln launch counts of the
  # runs' --json files and the ratios, of one configuration or (none given) of all; with
  # KILN_BENCH_JSON, all of them written there too.
  summarize() {
    "${python[@]}" - "$@" <<'PY'
import glob, json, os, re, statistics, sys
log, jdir = sys.argv[1], sys.argv[2]
only = (int(sys.argv[3].split(":")[0]), int(sys.argv[3].split(":")[1]), sys.argv[4]) if len(sys.argv) > 4 else None
LINE = re.compile(r"(kiln(?:\[[^\]]+\])?|pytorch\[[^\]]+\]) model=(\w+) mode=(\S+) ")
FIELD = re.compile(r" (batch|image|images_per_sec|ms_per_step)=([\d.]+)")
def precision_of(mode):
    tags = set(mode.split("+")[1:])
    return next((p for p in ("tf32", "bf16", "fp16") if p in tags), "fp32")
runs, order, notes = {}, [], {"not_run": [], "failed": []}
for line in open(log):
    m = LINE.match(line)
    f = dict(FIELD.findall(line))
    if m and len(f) == 4:  # the fields by name, wherever the program prints them
        who, model, mode = m.groups()
        b, i, ips, ms = f["batch"], f["image"], f["images_per_sec"], f["ms_per_step"]
        key = (int(i), int(b), precision_of(mode))
        if key not in runs:
            order.append(key)
        runs.setdefault(key, {}).setdefault(who, []).append((float(ips), float(ms)))
    elif line.startswith("not run: "):
        notes["not_run"].append(line[len("not run: "):].strip())
    elif line.startswith("failed: "):
        notes["failed"].append(line[len("failed: "):].strip())
launches = {}  # (image, batch, precision, graph) -> [(kernel launches, enqueue ms) per step]
for f in glob.glob(os.path.join(jdir, "*.json")):
    try:
        j = json.load(open(f))
    except ValueError:
        continue
    if "kernel_launches_per_step" in j:
        key = (j.get("image_size"), j.get("batch_size"), j.get("precision"), bool(j.get("cuda_graph")))
        launches.setdefault(key, []).append((j["kernel_launches_per_step"], j.get("enqueue_ms_per_step")))
EAGER = ("pytorch[eager]", "pytorch[eager+nhwc]")
COMPILED = "pytorch[compile+nhwc]"
configs = []
for key in order:
    image, batch, prec = key
    by = runs[key]
    med = {w: statistics.median(v[0] for v in r) for w, r in by.items()}
    ms = {w: statistics.median(v[1] for v in r) for w, r in by.items()}
    c = {"model": "resnet50", "image": image, "batch": batch, "precision": prec,
         "rounds": max(len(r) for r in by.values()),
         "images_per_sec": med, "ms_per_step": ms, "ratios": {}, "kiln_launches": {}}
    eager = [(med[w], w) for w in EAGER if w in med]
    best = max(eager) if eager else None
    if best:
        c["pytorch_eager_best"] = best[1]
    for kiln in ("kiln[graph]", "kiln", "kiln[nhwc]"):
        if kiln in med and best:
            c["ratios"][f"{kiln} / pytorch eager best"] = med[kiln] / best[0]
        if kiln in med and COMPILED in med:
            c["ratios"][f"{kiln} / {COMPILED}"] = med[kiln] / med[COMPILED]
    if "kiln[graph]" in med and "kiln" in med:
        c["ratios"]["kiln[graph] / kiln"] = med["kiln[graph]"] / med["kiln"]
    for graph, who in ((False, "kiln"), (True, "kiln[graph]")):
        l = launches.get((image, batch, prec, graph))
        if l:
            c["kiln_launches"][who] = {
                "kernel_launches_per_step": statistics.median(x[0] for x in l),
                "enqueue_ms_per_step": statistics.median(x[1] for x in l if x[1] is not None)
                if any(x[1] is not None for x in l) else None}
    configs.append(c)
    if only and key != only:
        continue
    print(f"resnet50 train, {image}x{image}, batch {batch}, {prec} (median over {c['rounds']} "
          f"round{'s' if c['rounds'] > 1 else ''}):")
    for who in sorted(med, key=lambda w: (w.startswith("pytorch"), w)):
        extra = ""
        if who in c["kiln_launches"]:
            k = c["kiln_launches"][who]
            extra = f"   {k['kernel_launches_per_step']:.0f} launches/step" + (
                f", {k['enqueue_ms_per_step']:.2f} ms/step to enqueue" if k["enqueue_ms_per_step"] is not None else "")
        print(f"  {who:24s} {med[who]:8.1f} img/s {ms[who]:8.2f} ms/step{extra}")
    for name, r in c["ratios"].items():
        print(f"  {name + (f' ({best[1]})' if 'eager best' in name else '')} = {r:.2f}x")
if not only:
    for n in notes["not_run"]:
        print(f"not run: {n}")
    for n in notes["failed"]:
        print(f"failed: {n}")
out = os.environ.get("KILN_BENCH_JSON")
if out:  # every configuration so far
    with open(out + ".tmp", "w") as f:
        json.dump({"configs": configs, **notes}, f, indent=2)
        f.write("\n")
    os.replace(out + ".tmp", out)
csv_out = os.environ.get("KILN_BENCH_CSV")
if csv_out and not only:
    import csv
    with open(csv_out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["workload", "runner", "images_per_sec"])
        w.writeheader()
        for c in configs:
            for who, v in c["images_per_sec"].items():
                w.writerow({"workload": f"resnet50 train {c['image']}:{c['batch']} {c['precision']}",
                            "runner": who, "images_per_sec": f"{v:.1f}"})
    print(f"wrote {csv_out}")
PY
  }
  # The PyTorch process (bench_pytorch_step.py --serve), started at the first PyTorch run: one
  # request a line on pt_in, one answer a line on pt_out.
  pt_pid="" pt_in="" pt_out=""
  pt_start() {
    coproc PTSERVE { exec "${python[@]}" "$root/tools/bench_pytorch_step.py" --serve --model resnet50 \
      --mode train --device "$device" --threads "$threads"; }
    pt_pid=$PTSERVE_PID
    local to=${PTSERVE[1]} from=${PTSERVE[0]}
    exec {pt_in}>&"$to" {pt_out}<&"$from"
    exec {to}>&- {from}<&-  # this shell's own copies closed: closing pt_in is end of input
  }
  pt_stop() {  # end of input ends it; one that does not end within 30 s is stopped
    [[ -n $pt_pid ]] || return 0
    exec {pt_in}>&- {pt_out}<&-
    for _ in $(seq 60); do
      kill -0 "$pt_pid" 2>/dev/null || break
      sleep 0.5
    done
    kill "$pt_pid" 2>/dev/null || true
    wait "$pt_pid" 2>/dev/null || true
    pt_pid=""
  }
  # pt_ask LABEL FLAGS...: one timed PyTorch run (the first of a setup compiles and warms it up,
  # untimed); its line named LABEL, logged and printed.
  pt_ask() {
    local label=$1 reply=""
    shift
    [[ -n $pt_pid ]] || pt_start
    if printf '%s\n' "$*" >&"$pt_in" && IFS= read -r -t 900 reply <&"$pt_out"; then
      if [[ $reply == "pytorch "* ]]; then
        echo "$label ${reply#pytorch }" | tee -a "$log"
        return 0
      fi
      echo "failed: $label ($*): ${reply:-an empty answer}" | tee -a "$log"
    else
      echo "failed: $label ($*): the PyTorch process gave no answer (it ended or hung: its messages are above)" | tee -a "$log"
      pt_stop
    fi
    failures=$((failures + 1))
  }
  pt_reset() {  # between configurations: the PyTorch process drops its setups and compiled code
    [[ -n $pt_pid ]] || return 0
    local reply=""
    if ! printf 'reset\n' >&"$pt_in" || ! IFS= read -r -t 120 reply <&"$pt_out" || [[ $reply != reset ]]; then
      pt_stop
    fi
  }
  # kiln_run LABEL FLAGS...: one train_step_bench run, its --json kept for the launch counts.
  kiln_run() {
    local label=$1
    shift
    nj=$((nj + 1))
    if ! run "$label" "$bench" "${kcommon[@]}" "$@" --json "$jdir/kiln-$nj.json"; then
      echo "failed: $label ($*): train_step_bench failed (its message is above)" | tee -a "$log"
      failures=$((failures + 1))
    fi
  }

  kiln_help=$("$bench" --help 2>&1 || true)
  if [[ ",$runners," == *,kiln-graph,* && $kiln_help != *--cuda-graph* ]]; then
    echo "not run: kiln[graph]: ${bench#"$root"/} has no --cuda-graph option (not built yet)" | tee -a "$log"
    runners=$(tr , '\n' <<<"$runners" | grep -vx kiln-graph | paste -sd, -)
  fi
  IFS=, read -r -a precisions <<<"$precision"
  IFS=, read -r -a workloads <<<"$workload"
  failures=0 nj=0 slowest=0
  for prec in "${precisions[@]}"; do
    for w in "${workloads[@]}"; do
      img=${w%%:*} b=${w##*:}
      if ((seconds > 0 && SECONDS + slowest > seconds)); then
        echo "not run: $w $prec: out of time (KILN_BENCH_SECONDS=$seconds, $SECONDS s gone, the slowest configuration so far took $slowest s)" | tee -a "$log"
        continue
      fi
      start=$SECONDS
      # Past 4 times the 128:32 step's work (224:128 is 12 times it), fewer steps.
      if ((img * img * b > 4 * 128 * 128 * 32)); then steps=10 warm=3; else steps=20 warm=5; fi
      kcommon=(--model resnet50 --mode train --device "$device" --threads "$threads" --batch-size "$b"
               --image-size "$img" --precision "$prec" --steps "$steps" --warmup "$warm")
      pcommon=(--batch-size "$b" --image-size "$img" --precision "$prec" --steps "$steps")
      for r in $(seq "$rounds"); do
        echo "== resnet50 train $w $prec: round $r of $rounds ($device)"
        for runner in ${runners//,/ }; do
          case $runner in
            kiln) kiln_run kiln ;;
            kiln-graph) kiln_run "kiln[graph]" --cuda-graph ;;
            kiln-nhwc) kiln_run "kiln[nhwc]" --memory-format channels_last ;;
            pytorch) pt_ask "pytorch[eager]" "${pcommon[@]}" --warmup "$warm" ;;
            pytorch-nhwc) pt_ask "pytorch[eager+nhwc]" "${pcommon[@]}" --warmup "$warm" --channels-last ;;
            pytorch-compile) pt_ask "pytorch[compile+nhwc]" "${pcommon[@]}" --channels-last --compile ;;
          esac
        done
      done
      pt_reset
      echo
      summarize "$log" "$jdir" "$w" "$prec"
      echo
      if ((SECONDS - start > slowest)); then slowest=$((SECONDS - start)); fi
    done
  done
  pt_stop
  echo "== every configuration"
  summarize "$log" "$jdir"
  if ((failures > 0)); then
    echo "tools/bench_resnet_vs_pytorch.sh: $failures runs failed (their messages are above)" >&2
    exit 1
  fi
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
    run kiln "${k[@]}" --memory-format channels_last
    [[ $mode == eval ]] && run kiln "${k[@]}" --winograd --fold-bn
    run "pytorch[tuned+nhwc]" "${p[@]}" "${tuned[@]}" "${py[@]}" --channels-last
  done
done
echo
"${python[@]}" - "$log" "$image" "$batch" <<'PY'
import re, statistics, sys
image, batch = sys.argv[2], sys.argv[3]
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
    print(f"{model} {mode} (batch {batch}, {image}x{image}, median img/s over {len(next(iter(by.values())))} runs):")
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
