#!/usr/bin/env bash
# tools/bench_vs_pytorch.sh: Kiln vs PyTorch on the MNIST CNN's training step (batch 128, data
# in memory), at 1 and 2 threads, alternating the two programs in one run so machine drift
# hits both. PyTorch runs in its best 2-core setup: torch threads = N, OpenBLAS threads = 1
# (otherwise its two thread pools fight). Prints each run, then medians and Kiln/PyTorch.
#
#   tools/bench_vs_pytorch.sh [rounds=3] [kernels=vendor] [precision=fp32]
# precision bf16 / fp16: both sides under autocast (Kiln's AutocastGuard, torch.autocast("cpu")).
# Needs a build (tools/build.sh) and Debian's python3-torch (KILN_SETUP_EXTRAS=1 tools/setup.sh).
# ResNets: tools/bench_resnet_vs_pytorch.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench=${KILN_BUILD_DIR:-$root/build}/apps/train_step_bench
rounds=${1:-3}
kernels=${2:-vendor}
precision=${3:-fp32}
usage() {
  echo "tools/bench_vs_pytorch.sh: error: $1" >&2
  echo "usage: tools/bench_vs_pytorch.sh [rounds=3] [kernels=hand|vendor] [precision=fp32|bf16|fp16]" >&2
  exit 2
}
[[ $# -le 3 ]] || usage "at most 3 arguments, got $#"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage "rounds must be a whole number >= 1 (got $rounds)"
[[ $kernels =~ ^(hand|vendor)$ ]] || usage "kernels must be one of hand, vendor (got $kernels)"
[[ $precision =~ ^(fp32|bf16|fp16)$ ]] || usage "precision must be one of fp32, bf16, fp16 (got $precision)"
[[ -x "$bench" ]] || { echo "missing $bench: run tools/build.sh first" >&2; exit 2; }
/usr/bin/python3 -c "import torch" 2>/dev/null || {
  echo "PyTorch not found for /usr/bin/python3: run KILN_SETUP_EXTRAS=1 tools/setup.sh" >&2; exit 2; }

log=$(mktemp)
for r in $(seq "$rounds"); do
  for t in 1 2; do
    OMP_NUM_THREADS=$t "$bench" --threads "$t" --kernels "$kernels" --precision "$precision" | tee -a "$log"
    OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$root/tools/bench_pytorch_step.py" --threads "$t" --precision "$precision" | tee -a "$log"
  done
done
echo
/usr/bin/python3 - "$log" "$precision" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(kiln|pytorch) .*threads=(\d+).*images_per_sec=([\d.]+)", line)
    if m:
        runs.setdefault((m[1], int(m[2])), []).append(float(m[3]))
for t in (1, 2):
    k = statistics.median(runs[("kiln", t)]); p = statistics.median(runs[("pytorch", t)])
    print(f"{sys.argv[2]} threads={t}: kiln {k:.0f} img/s, pytorch {p:.0f} img/s, kiln/pytorch = {k / p:.2f}x")
PY
rm -f "$log"
