#!/usr/bin/env bash
# tools/gpu_check.sh REPORT_DIR [options]: on a machine with an NVIDIA GPU, from the repository
# root, the one command that checks Kiln on a real GPU (docs/gpu_check.md):
#
#   1. prerequisites: a GPU (else exit 2), the carried bundle unpacked (tools/gpu_bundle.sh
#      unpack), MNIST, nvcc, cmake, ninja, cuDNN/cuBLAS (falls back to PyTorch's pip copies)
#   2. build: Release, -DKILN_CUDA=ON for the GPU present (sm_90 on H100/H200) into build-gpu/
#   3. test:  ctest -L gpu, once with the hand kernels and once with KILN_KERNELS=vendor (cuBLAS,
#             cuDNN) (and, with --cpu-tests, the CPU suite: ctest -LE 'gpu|sim')
#   4. bench: gemm_bench (hand vs cuBLAS), gemm_steps (every GEMM step at 4096^3: the f32 steps,
#             the tensor-core kernel on bf16 and f16, cuBLAS SGEMM and cublasGemmEx on bf16: the
#             report's tc_bf16/vendor_bf16), conv_bench (hand vs cuDNN, ResNet-50 shapes),
#             mnist_train --device cuda --epochs 3 with --kernels vendor and hand, and the same
#             training in PyTorch (tools/pytorch_mnist.py) for the ratio; ResNet-50 training on the
#             GPU against torchvision's, TF32 off and on (tools/bench_resnet_vs_pytorch.sh)
#   5. report: REPORT_DIR/report.md and report.json (+ logs/, the runs' JSON, steps.tsv)
#
# Options:
#   --only STAGES   build | test | bench, comma-separated (default: all). The build always runs
#                   first (incremental); the report merges every step recorded in REPORT_DIR, so
#                   a check split over two calls into one REPORT_DIR ends with one full report.
#                   Single steps too: ctest_gpu, ctest_gpu_vendor, ctest_cpu, gemm_bench, gemm_steps, conv_bench, mnist_vendor,
#                   pytorch, mnist_hand, resnet_gpu (e.g. --only pytorch,mnist_hand after a run out of time).
#                   --only report rewrites report.md/json from what REPORT_DIR holds, nothing else.
#   --cpu-tests     also run the CPU suite (ctest -LE 'gpu|sim'; minutes)
#   --epochs N      mnist_train / PyTorch epochs (default 3)
#   --arch A        CMAKE_CUDA_ARCHITECTURES (default: from the GPU's compute capability, e.g. 90)
#   --budget S      wall-clock seconds for the whole check (default 540): a step that would not
#                   fit is skipped and the exit code says so (3), so a report is always written
#                   inside a 10-minute command limit
#   --build-dir D   build tree (default build-gpu)
# Environment: PYTHON (default python3) runs tools/pytorch_mnist.py and the report.
#
# Exit codes: 0 every step passed (a benchmark program not built yet is reported as missing, not
# failed); 1 a step failed; 2 prerequisites missing (no GPU, no nvcc, no MNIST...); 3 steps were
# skipped for lack of time (run again with --only, same REPORT_DIR).
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | grep -v '^set' | sed 's/^# \{0,1\}//'; }
die_usage() { echo "gpu_check.sh: error: $*" >&2; echo "usage: tools/gpu_check.sh REPORT_DIR [--only build|test|bench|report] [--cpu-tests] [--epochs N] [--arch A] [--budget S] [--build-dir D]" >&2; exit 2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
report="" only="build,test,bench" cpu_tests=0 epochs=3 arch="" budget=540 build_dir="build-gpu"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --only) [[ $# -ge 2 ]] || die_usage "--only needs a value"; only=$2; shift 2 ;;
    --cpu-tests) cpu_tests=1; shift ;;
    --epochs) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die_usage "--epochs needs a positive number"; epochs=$2; shift 2 ;;
    --arch) [[ $# -ge 2 ]] || die_usage "--arch needs a value (e.g. 90 or native)"; arch=$2; shift 2 ;;
    --budget) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || die_usage "--budget needs seconds"; budget=$2; shift 2 ;;
    --build-dir) [[ $# -ge 2 ]] || die_usage "--build-dir needs a directory"; build_dir=$2; shift 2 ;;
    -*) die_usage "unknown option $1" ;;
    *) [[ -z "$report" ]] || die_usage "one REPORT_DIR only (got '$report' and '$1')"; report=$1; shift ;;
  esac
done
[[ -n "$report" ]] || die_usage "REPORT_DIR is missing"
for s in ${only//,/ }; do
  [[ "$s" =~ ^(build|test|bench|report|ctest_gpu|ctest_gpu_vendor|ctest_cpu|gemm_bench|gemm_steps|conv_bench|mnist_vendor|pytorch|mnist_hand|resnet_gpu)$ ]] ||
    die_usage "--only: unknown stage '$s' (build, test, bench, report, or one step: ctest_gpu, ctest_gpu_vendor, ctest_cpu, gemm_bench, gemm_steps, conv_bench, mnist_vendor, pytorch, mnist_hand, resnet_gpu)"
done
has_stage() { [[ ",$only," == *",$1,"* ]]; }
want() { has_stage "$1" || has_stage "$2"; }  # want STEP STAGE: the step is selected

mkdir -p "$report/logs" || { echo "gpu_check.sh: error: cannot create $report" >&2; exit 2; }
report=$(cd "$report" && pwd)
cd "$root" || exit 2
[[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"
PYTHON=${PYTHON:-python3}
steps="$report/steps.tsv"
info="$report/info.txt"
touch "$steps" "$info"

say() { echo "gpu_check.sh: $*"; }

# record NAME STATUS RC SECONDS LOG NOTE: one line per step in steps.tsv (a re-run replaces it).
record() {
  local tmp="$steps.tmp"
  awk -F'\t' -v n="$1" '$1 != n' "$steps" >"$tmp" 2>/dev/null
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${6//$'\t'/ }" >>"$tmp"
  mv "$tmp" "$steps"
}

# run_step NAME CAP_SECONDS COMMAND...: runs it under a timeout (the smaller of CAP and the time
# left in the budget), output in logs/NAME.log, and records the outcome.
budget_skipped=0 failed=0
run_step() {
  local name=$1 cap=$2 log="$report/logs/$1.log" left t start rc status note=""
  shift 2
  left=$((budget - SECONDS - 15))
  if ((left < 20)); then
    record "$name" skipped - 0 "" "out of time (budget ${budget}s): run again with --only and the same report directory"
    say "$name: SKIPPED (out of time)"
    budget_skipped=1
    return 3
  fi
  t=$((cap < left ? cap : left))
  say "$name: $* (timeout ${t}s, log logs/$name.log)"
  start=$SECONDS
  {
    echo "\$ $*"
    timeout -k 10 "$t" "$@"
  } >"$log" 2>&1
  rc=$?
  if ((rc == 0)); then
    status=ok
  elif ((rc == 124 || rc == 137)); then
    status=failed note="timed out after ${t}s"
  else
    status=failed note="exit code $rc"
  fi
  [[ "$status" == ok ]] || failed=1
  record "$name" "$status" "$rc" "$((SECONDS - start))" "logs/$name.log" "$note"
  tail -n 4 "$log" | sed 's/^/    /'
  say "$name: ${status^^} ($((SECONDS - start)) s${note:+, $note})"
  [[ "$status" == ok ]]
}

finish() {  # finish EXIT_CODE: writes the report, prints it, exits
  write_report
  [[ -f "$report/report.md" ]] && { echo; cat "$report/report.md"; }
  say "report: $report/report.md and report.json"
  exit "$1"
}

# ---- the report (Python: any python3, standard library only) -----------------------------------
write_report() {
  "$PYTHON" "$root/tools/gpu_report.py" "$report" "$epochs" || say "warning: writing the report failed"
}

if [[ "$only" == report ]]; then
  [[ -s "$info" ]] || { say "error: $report holds no earlier check (no info.txt)" >&2; exit 2; }
  finish 0
fi

# ---- 1. prerequisites ------------------------------------------------------------------------
prereq_fail() {
  say "error: $*" >&2
  record prerequisites failed 2 0 "" "$*"
  finish 2
}

: >"$info"
info_put() { printf '%s=%s\n' "$1" "$2" >>"$info"; }
info_put date "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
info_put stages "$only"

if [[ "${KILN_GPU_CHECK_ALLOW_NO_GPU:-0}" == 1 ]]; then
  say "KILN_GPU_CHECK_ALLOW_NO_GPU=1: going on without a GPU (testing this script; GPU steps will fail)"
  info_put gpu "none (KILN_GPU_CHECK_ALLOW_NO_GPU=1)"
elif ! command -v nvidia-smi >/dev/null 2>&1; then
  say "error: no GPU: nvidia-smi is not installed, so this is not a machine with an NVIDIA GPU and driver." >&2
  say "This check runs on a GPU machine (docs/gpu_check.md). Without a GPU, tools/test.sh runs the CUDA kernels under the simulator." >&2
  exit 2
else
  if ! gpus=$(timeout 30 nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$gpus"; then
    say "error: no GPU: nvidia-smi lists none (${gpus:-no output})." >&2
    say "This check runs on a GPU machine (docs/gpu_check.md). Without a GPU, tools/test.sh runs the CUDA kernels under the simulator." >&2
    exit 2
  fi
  IFS=, read -r gname gdriver gmem gcap < <(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
      --format=csv,noheader 2>/dev/null | head -n 1)
  trim() { sed 's/^ *//; s/ *$//' <<<"$1"; }
  info_put gpu "$(trim "${gname:-}")"
  info_put driver "$(trim "${gdriver:-}")"
  info_put gpu_memory "$(trim "${gmem:-}")"
  info_put compute_capability "$(trim "${gcap:-}")"
  info_put gpu_count "$(grep -c '^GPU ' <<<"$gpus")"
  if [[ -z "$arch" && "${gcap:-}" =~ ([0-9]+)\.([0-9]+) ]]; then arch="${BASH_REMATCH[1]}${BASH_REMATCH[2]}"; fi
fi
[[ -n "$arch" ]] || arch=90

# The source: git where the tree has it, else what the bundle recorded when it was made.
if commit=$(git -C "$root" rev-parse HEAD 2>/dev/null); then
  info_put commit "$commit"
  info_put changed_files "$(git -C "$root" status --porcelain 2>/dev/null | wc -l)"
  info_put commit_source "git"
elif [[ -f .gpu_bundle/source.txt ]]; then
  info_put commit "$(sed -n 's/^commit=//p' .gpu_bundle/source.txt)"
  info_put changed_files "$(sed -n 's/^changed_files=//p' .gpu_bundle/source.txt)"
  info_put commit_source "recorded by tools/gpu_bundle.sh at $(sed -n 's/^made=//p' .gpu_bundle/source.txt) (no .git here)"
else
  info_put commit unknown
fi

# The carried bundle: unpack once (tools/gpu_bundle.sh says it is a no-op when done), then use it.
orig_ld_library_path=${LD_LIBRARY_PATH-}
bundle_args=()
if [[ -d .gpu_bundle/debs ]]; then
  if ! bash tools/gpu_bundle.sh unpack >"$report/logs/bundle_unpack.log" 2>&1; then
    tail -n 5 "$report/logs/bundle_unpack.log" >&2
    prereq_fail "tools/gpu_bundle.sh unpack failed (logs/bundle_unpack.log)"
  fi
  # shellcheck disable=SC1091
  source .gpu_bundle/env.sh
  bundle_args=("${KILN_BUNDLE_CMAKE_ARGS[@]}")
  info_put dependencies "bundle (.gpu_bundle, Debian 12 packages)"
else
  say "no .gpu_bundle here: using the machine's own packages (make one with tools/gpu_bundle.sh)"
  info_put dependencies "the machine's own packages"
fi

# Tools.
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [[ -x "$d/nvcc" ]] && { PATH="$d:$PATH"; break; }
  done
fi
command -v nvcc >/dev/null 2>&1 || prereq_fail "nvcc not found (not on PATH, not in /usr/local/cuda/bin)"
command -v cmake >/dev/null 2>&1 || prereq_fail "cmake not found"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
command -v "$PYTHON" >/dev/null 2>&1 || prereq_fail "$PYTHON not found (set PYTHON)"
info_put nvcc "$(nvcc --version | grep -i release | head -n 1)"
info_put cmake "$(cmake --version | head -n 1)"
info_put cxx "$(c++ --version 2>/dev/null | head -n 1)"
info_put cpus "$(nproc)"
info_put cuda_architectures "$arch"

# cuDNN and cuBLAS: next to nvcc or in the system, else PyTorch's pip copies (site-packages/
# nvidia/...), exposed through a prefix of links (the pip wheels have no unversioned libX.so).
cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
extra_prefix=()
lib_found() {  # lib_found NAME: libNAME.so in the toolkit or the system
  local d
  for d in "$cuda_home/lib64" "$cuda_home/lib" "$cuda_home/targets/x86_64-linux/lib" /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/lib64; do
    [[ -e "$d/lib$1.so" ]] && return 0
  done
  return 1
}
header_found() {
  local d
  for d in "$cuda_home/include" "$cuda_home/targets/x86_64-linux/include" /usr/include /usr/include/x86_64-linux-gnu /usr/local/cuda/include; do
    [[ -e "$d/$1" ]] && return 0
  done
  return 1
}
pip_prefix="$build_dir/.pip-cuda-prefix"
for pair in cudnn:cudnn.h cublas:cublas_v2.h; do
  lib=${pair%%:*} header=${pair#*:}
  if lib_found "$lib" && header_found "$header"; then
    info_put "$lib" "system ($cuda_home or /usr)"
    continue
  fi
  # shellcheck disable=SC2016
  nv_dirs=$("$PYTHON" -c 'import nvidia, sys; print("\n".join(nvidia.__path__))' 2>/dev/null)
  h=$(for d in $nv_dirs; do find "$d" -name "$header" -path '*/include/*' 2>/dev/null; done | head -n 1)
  so=$(for d in $nv_dirs; do find "$d" -name "lib$lib.so*" -path '*/lib/*' 2>/dev/null; done | sort | head -n 1)
  if [[ -z "$h" || -z "$so" ]]; then
    say "warning: $lib ($header, lib$lib.so) found neither next to nvcc nor in PyTorch's packages: the build may fail"
    info_put "$lib" "not found"
    continue
  fi
  mkdir -p "$pip_prefix/include" "$pip_prefix/lib"
  for f in "$(dirname "$h")"/*; do ln -sfn "$f" "$pip_prefix/include/$(basename "$f")"; done
  for f in "$(dirname "$so")"/lib*.so*; do
    ln -sfn "$f" "$pip_prefix/lib/$(basename "$f")"
    base=$(basename "$f"); base=${base%%.so*}.so
    [[ -e "$pip_prefix/lib/$base" ]] || ln -sfn "$f" "$pip_prefix/lib/$base"
  done
  LD_LIBRARY_PATH="$(dirname "$so")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
  [[ " ${extra_prefix[*]} " == *" $pip_prefix "* ]] || extra_prefix+=("$pip_prefix")
  info_put "$lib" "PyTorch's pip package: $(dirname "$(dirname "$so")")"
  say "$lib: using PyTorch's copy in $(dirname "$(dirname "$so")") (through $pip_prefix)"
done
if ((${#extra_prefix[@]})); then
  # find_library/find_path through CMAKE_PREFIX_PATH; plain -lcudnn and #include through these.
  export CPATH="$pip_prefix/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$pip_prefix/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi

# MNIST (the bundle installed it; else datasets/fetch_mnist.sh, which needs the network).
if [[ "$only" != build ]]; then
  if ! bash datasets/fetch_mnist.sh >"$report/logs/mnist.log" 2>&1; then
    tail -n 3 "$report/logs/mnist.log" >&2
    prereq_fail "MNIST is not in datasets/mnist and cannot be downloaded here: make the bundle with tools/gpu_bundle.sh (it carries MNIST) and copy .gpu_bundle/ to this machine with the tree"
  fi
fi
record prerequisites ok 0 "$SECONDS" "" "GPU $(sed -n 's/^gpu=//p' "$info"), arch $arch"

# ---- 2. build --------------------------------------------------------------------------------
configure_and_build() {
  local prefix_list=""
  if ((${#extra_prefix[@]})); then  # the bundle's prefix is in bundle_args: repeat it before these
    prefix_list="${KILN_BUNDLE_ROOT:+$KILN_BUNDLE_ROOT/usr}"
    for p in "${extra_prefix[@]}"; do prefix_list="${prefix_list:+$prefix_list;}$p"; done
  fi
  run_step configure 180 cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" \
    "${bundle_args[@]}" ${prefix_list:+"-DCMAKE_PREFIX_PATH=$prefix_list"} || return 1
  # Every dependency found in the bundle, none in the machine's /usr (which would not be what we tested).
  if ((${#bundle_args[@]})); then
    local outside
    outside=$(grep -E '^(BLAS_[A-Za-z0-9]*_LIBRARY|CBLAS_INCLUDE_DIR|dnnl_DIR|OpenCL_LIBRARY|OpenCL_INCLUDE_DIR|GTest_DIR|CLI11_DIR|nlohmann_json_DIR)(:[A-Z]+)?=' \
              "$build_dir/CMakeCache.txt" | grep -v "=$KILN_BUNDLE_ROOT/" || true)
    if [[ -n "$outside" ]]; then
      say "warning: dependencies found outside the bundle:"
      printf '    %s\n' "$outside"
      echo "warning: dependencies found outside the bundle: $outside" >>"$report/logs/configure.log"
    fi
  fi
  run_step build 600 cmake --build "$build_dir" -j "$(nproc)"
}

build_ok=0 no_build="the build failed"
if configure_and_build; then build_ok=1; fi
awk -F'\t' '($1 == "configure" || $1 == "build") && $2 == "skipped" {s = 1} END {exit !s}' "$steps" &&
  no_build="not built: out of time"

# ---- 3. tests --------------------------------------------------------------------------------
if want ctest_gpu test; then
  if ((build_ok)); then
    run_step ctest_gpu 240 ctest --test-dir "$build_dir" -L gpu --output-on-failure --no-tests=error \
      --timeout 120 -j 8
  else
    record ctest_gpu skipped - 0 "" "$no_build"
  fi
fi
# The same tests through cuBLAS and cuDNN: every CUDA op that has a vendor path takes it.
if want ctest_gpu_vendor test; then
  if ((build_ok)); then
    run_step ctest_gpu_vendor 240 env KILN_KERNELS=vendor ctest --test-dir "$build_dir" -L gpu \
      --output-on-failure --no-tests=error --timeout 120 -j 8
  else
    record ctest_gpu_vendor skipped - 0 "" "$no_build"
  fi
fi
if ((cpu_tests)) || has_stage ctest_cpu; then
  if ((build_ok)); then
    run_step ctest_cpu 300 ctest --test-dir "$build_dir" -LE 'gpu|sim' --output-on-failure \
      --timeout 300 -j "$(nproc)"
  else
    record ctest_cpu skipped - 0 "" "$no_build"
  fi
fi

# ---- 4. benchmarks ---------------------------------------------------------------------------
# bench_program NAME BINARY REQUIRED_FLAGS...: runs the benchmark if it is built and takes the
# flags; otherwise records it as missing (not written yet), not failed.
bench_program() {
  local name=$1 bin=$2 cap=$3 flag
  shift 3
  if [[ ! -x "$bin" ]]; then
    record "$name" missing - 0 "" "${bin#"$root"/} is not built (not written yet, or not in this build)"
    say "$name: MISSING (${bin#"$root"/} is not built)"
    return
  fi
  for flag in "$@"; do
    [[ "$flag" == --* ]] || continue
    if ! "$bin" --help 2>&1 | grep -q -- "${flag%%=*}"; then
      record "$name" missing - 0 "" "${bin#"$root"/} has no ${flag%%=*} option yet (its CUDA version is not written yet)"
      say "$name: MISSING (${bin#"$root"/} has no ${flag%%=*})"
      return
    fi
  done
  run_step "$name" "$cap" "$bin" "$@"
}

run_mnist() {  # run_mnist hand|vendor
  rm -f "$report/mnist_$1.json"
  run_step "mnist_$1" 200 "$build_dir/apps/mnist_train" --device cuda --epochs "$epochs" --kernels "$1" \
    --json "$report/mnist_$1.json"
}

bench_steps=(gemm_bench gemm_steps conv_bench mnist_vendor pytorch mnist_hand resnet_gpu mp_gpu mp_cpu)
for step in "${bench_steps[@]}"; do
  want "$step" bench || continue
  if ((!build_ok)); then
    record "$step" skipped - 0 "" "$no_build"
    continue
  fi
  case "$step" in
    gemm_bench)
      rm -f "$report/gemm_bench.json"
      bench_program gemm_bench "$build_dir/apps/gemm_bench" 120 --device cuda --sizes 1024,2048,4096,8192 --kernels hand,vendor \
        --json "$report/gemm_bench.json" ;;
    gemm_steps)
      # Step 4 (tensor cores, bf16 and f16 inputs) against the f32 steps, cuBLAS SGEMM and
      # cublasGemmEx on the same bf16 inputs at 4096^3; gemm_bench prints each tensor-core kernel
      # over regblock and over cuBLAS, and tc_bf16/vendor_bf16 (the report's headline figure).
      rm -f "$report/gemm_steps.json"
      bench_program gemm_steps "$build_dir/apps/gemm_bench" 90 --device cuda --sizes 4096 \
        --kernels naive,tiled,regblock,tc_bf16,tc_f16,vendor,vendor_bf16 --iters 5 --json "$report/gemm_steps.json" ;;
    conv_bench) bench_program conv_bench "$build_dir/apps/conv_bench" 150 --device cuda --shapes resnet50 ;;
    mnist_vendor) run_mnist vendor ;;
    mnist_hand) run_mnist hand ;;
    resnet_gpu)
      # Kiln with the bundle's libraries, PyTorch in the machine's own environment (as above).
      if [[ -n "$orig_ld_library_path" ]]; then pt_env="env LD_LIBRARY_PATH=$orig_ld_library_path"; else pt_env="env -u LD_LIBRARY_PATH"; fi
      run_step resnet_gpu 240 env KILN_BUILD_DIR="$build_dir" PYTHON="$pt_env $PYTHON" PYTHONUNBUFFERED=1 \
        "$root/tools/bench_resnet_vs_pytorch.sh" 2 1 cuda:0 ;;
    mp_gpu)
      # resnet_bench on one GPU: the single-device step time (two stages on one GPU only show
      # the pipeline's overhead; model parallelism needs two GPUs to gain).
      rm -f "$report/mp_gpu.json"
      bench_program mp_gpu "$build_dir/apps/resnet_bench" 200 --devices cuda:0,cuda:0 \
        --image-size 128 --batch-size 120 --steps 3 --repeats 3 --split-sizes 20 \
        --modes single,model-parallel,pipeline --json "$report/mp_gpu.json" ;;
    mp_cpu)
      # The CPU-devices comparison with the machine's cores: four stages, cpu:0..cpu:3.
      rm -f "$report/mp_cpu.json"
      bench_program mp_cpu "$build_dir/apps/resnet_bench" 240 --devices cpu:0,cpu:1,cpu:2,cpu:3 \
        --steps 2 --repeats 3 --split-sizes 4,8,12 --json "$report/mp_cpu.json" ;;
    pytorch)
      # PyTorch runs in the machine's own library environment, without the bundle's.
      rm -f "$report/pytorch.json"
      if [[ -n "$orig_ld_library_path" ]]; then pt_env=(env "LD_LIBRARY_PATH=$orig_ld_library_path"); else pt_env=(env -u LD_LIBRARY_PATH); fi
      run_step pytorch 200 "${pt_env[@]}" PYTHONUNBUFFERED=1 "$PYTHON" "$root/tools/pytorch_mnist.py" --device cuda \
        --epochs "$epochs" --json "$report/pytorch.json" ;;
  esac
done

# ---- 5. report -------------------------------------------------------------------------------
if ((failed)); then
  finish 1
elif ((budget_skipped)); then
  say "out of time: run again at once (the machine stays warm ~30 s), same report directory:"
  say "  tools/gpu_check.sh ${report#"$root"/} --only $(awk -F'\t' '$2 == "skipped" {print $1}' "$steps" | paste -sd, -)"
  finish 3
fi
finish 0
