#!/usr/bin/env bash
# tools/gpu_check.sh REPORT_DIR [options]: on a machine with an NVIDIA GPU, from the repository
# root, the one command that checks Kiln on a real GPU (docs/gpu_check.md):
#
#   1. prerequisites: a GPU (else exit 2), the carried bundle unpacked (tools/gpu_bundle.sh
#      unpack), MNIST, nvcc, cmake, ninja, cuDNN/cuBLAS (falls back to PyTorch's pip copies)
#   2. build: Release, -DKILN_CUDA=ON for the GPU present (sm_90 on H100/H200) into build-gpu/,
#             only the targets the chosen steps run (--print-targets lists them): the gpu tests'
#             programs (the label target kiln_tests_gpu, and every program of a test that
#             `ctest -L gpu --show-only=json-v1` names), the benchmarks, Kiln's libraries
#   3. test:  ctest -L gpu -j <cores>, once with the hand kernels and once with KILN_KERNELS=vendor
#             (cuBLAS, cuDNN) (and, with --cpu-tests, the CPU suite: ctest -LE 'gpu|sim'); the
#             failed tests' output goes into the report (ctest --output-junit)
#   4. example: examples/custom_layer (its own CMake project: find_package(Kiln), a Swish layer
#             with a .cu file) built against this build installed into a prefix, its tests run on
#             the GPU (custom_layer)
#   5. bench: gemm_bench (hand vs cuBLAS, and steps 4-7 on bf16 vs cublasGemmEx at
#             1024..8192: the report's sm90_bf16/vendor_bf16), gemm_steps and gemm_steps_8192
#             (every GEMM step at 2048^3 and 4096^3, then at 8192^3 with fewer iterations: the f32
#             steps, the tensor-core kernels of steps 4 (WMMA), 5 (Hopper: TMA, wgmma), 6 (warp-
#             specialised) and 7 (persistent) on bf16 and f16, cuBLAS SGEMM and cublasGemmEx on
#             bf16: the report's ladder of steps 1-7 and its targets), conv_bench (hand vs
#             cuDNN, ResNet-50 shapes), mnist_train --device cuda --epochs 3 with --kernels
#             vendor and hand, and the same training in PyTorch (tools/pytorch_mnist.py) for the
#             ratio; ResNet-50 training on the GPU against torchvision's, TF32 off and on
#             (tools/bench_resnet_vs_pytorch.sh); the fast MNIST recipe with the training step
#             as one CUDA graph and the data on the GPU (mnist_graph: seconds of training to
#             99.0%); ResNet-50's training step as one CUDA graph (train_step_bench
#             --cuda-graph) against PyTorch eager (NCHW, channels_last) and torch.compile
#             (reduce-overhead) at 128x128 batch 32 and 224x224 batch 128, one step per precision
#             (resnet_graph_fp32, _tf32, _bf16, _fp16)
#   6. sanitize: compute-sanitizer memcheck, racecheck, synccheck and initcheck over a few gpu
#             test programs (elementwise ops and reductions, GEMM, convolution, pooling,
#             BatchNorm, the loader), several at a time, each under a time cap, once a trivial
#             kernel ran clean under the tool here; runs the budget leaves out are skipped
#   7. report: REPORT_DIR/report.md and report.json (+ logs/, the runs' JSON, steps.tsv): every
#             step, the failed tests' output, the sanitizers' summaries, and what was not run
#             with the command that runs it
#
# Options:
#   --only STAGES   build | test | example | bench | sanitize, comma-separated (default: all).
#                   The build always runs first (incremental, only what the steps need); the
#                   report merges every step recorded in REPORT_DIR, so a check split over two
#                   calls into one REPORT_DIR ends with one full report.
#                   Single steps too: ctest_gpu, ctest_gpu_vendor, ctest_cpu, custom_layer,
#                   gemm_bench, gemm_steps, gemm_steps_8192, conv_bench, mnist_vendor, pytorch,
#                   mnist_hand, mnist_graph, resnet_gpu, resnet_graph_fp32, resnet_graph_tf32,
#                   resnet_graph_bf16, resnet_graph_fp16 (all four: resnet_graph), mp_gpu,
#                   mp_cpu; one sanitizer's runs (memcheck, racecheck,
#                   synccheck, initcheck) or one run (sanitize_TOOL_PROGRAM, e.g.
#                   sanitize_racecheck_gemm_cuda_test). E.g. --only pytorch,mnist_hand after a run
#                   out of time: the report's last section gives the exact command.
#                   --only report rewrites report.md/json from what REPORT_DIR holds, nothing else.
#   --cpu-tests     also run the CPU suite (ctest -LE 'gpu|sim'; minutes; builds everything)
#   --epochs N      mnist_train / PyTorch epochs (default 3)
#   --arch A        CMAKE_CUDA_ARCHITECTURES (default: from the GPU's compute capability, e.g. 90)
#   --budget S      wall-clock seconds for the whole check (default 540): a step that would not
#                   fit is skipped and the exit code says so (3), so a report is always written
#                   inside a 10-minute command limit
#   --test-timeout S  each gpu test's timeout in the ctest runs (default 90; the slowest passing
#                   test took 29 s on an H200, so a hung test costs 90 s, not 120)
#   --sanitize-timeout S  each sanitizer run's time cap (default 120); a run stopped there is
#                   reported as partial (exit code 3), with the command that runs it again
#   --build-dir D   build tree (default build-gpu)
#   --print-targets configure, print the build targets the chosen steps need (one a line), exit;
#                   needs no GPU
# Environment: PYTHON (default python3) runs tools/pytorch_mnist.py and the report;
# OMP_NUM_THREADS (default 2 for the tests and sanitizer runs, which run many programs at once).
#
# Exit codes: 0 every step passed (a benchmark program not built yet is reported as missing, not
# failed); 1 a step failed; 2 prerequisites missing (no GPU, no nvcc, no MNIST...); 3 steps were
# skipped, or sanitizer runs cut at their time cap, for lack of time (run again with --only,
# same REPORT_DIR).
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | grep -v '^set' | sed 's/^# \{0,1\}//'; }
die_usage() { echo "gpu_check.sh: error: $*" >&2; echo "usage: tools/gpu_check.sh REPORT_DIR [--only build|test|example|bench|sanitize|report|STEP,...] [--cpu-tests] [--epochs N] [--arch A] [--budget S] [--test-timeout S] [--sanitize-timeout S] [--build-dir D] [--print-targets]" >&2; exit 2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
report="" only="build,test,example,bench,sanitize" cpu_tests=0 epochs=3 arch="" budget=540 build_dir="build-gpu"
test_timeout=90 sanitize_timeout=120 print_targets=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --only) [[ $# -ge 2 && -n "${2//,/}" ]] || die_usage "--only needs a value"; only=$2; shift 2 ;;
    --cpu-tests) cpu_tests=1; shift ;;
    --epochs) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die_usage "--epochs needs a positive number"; epochs=$2; shift 2 ;;
    --arch) [[ $# -ge 2 ]] || die_usage "--arch needs a value (e.g. 90 or native)"; arch=$2; shift 2 ;;
    --budget) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || die_usage "--budget needs seconds"; budget=$2; shift 2 ;;
    --build-dir) [[ $# -ge 2 ]] || die_usage "--build-dir needs a directory"; build_dir=$2; shift 2 ;;
    --test-timeout) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die_usage "--test-timeout needs seconds"; test_timeout=$2; shift 2 ;;
    --sanitize-timeout) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die_usage "--sanitize-timeout needs seconds"; sanitize_timeout=$2; shift 2 ;;
    --print-targets) print_targets=1; shift ;;
    -*) die_usage "unknown option $1" ;;
    *) [[ -z "$report" ]] || die_usage "one REPORT_DIR only (got '$report' and '$1')"; report=$1; shift ;;
  esac
done
[[ -n "$report" ]] || die_usage "REPORT_DIR is missing"

# The sanitizer runs, TOOL:PROGRAM (a gpu test program's target), in the order they start:
# memcheck over every program first, then racecheck and synccheck over those whose kernels share
# memory between threads and meet at barriers (reductions, GEMM tiles, convolution, pooling,
# BatchNorm, the Hopper GEMM's TMA ring and mbarriers; the loader's CUDA work is copies), then
# initcheck. Each is the step sanitize_TOOL_PROGRAM.
sanitize_programs=(ops_cuda_test gemm_cuda_test gemm_tensor_core_test conv2d_cuda_test pool2d_cuda_test
                   batchnorm2d_cuda_test loader_cuda_test gemm_sm90_test)
sanitize_tools=(memcheck racecheck synccheck initcheck)
sanitize_runs=()
for tool in "${sanitize_tools[@]}"; do
  for prog in "${sanitize_programs[@]}"; do
    [[ "$tool" =~ ^(racecheck|synccheck)$ && "$prog" == loader_cuda_test ]] && continue
    sanitize_runs+=("$tool:$prog")
  done
done

# The ResNet-50 CUDA-graph comparison, one step per precision (resnet_graph: all four).
graph_precisions=(fp32 tf32 bf16 fp16)
steps_vocabulary="ctest_gpu ctest_gpu_vendor ctest_cpu custom_layer gemm_bench gemm_steps gemm_steps_8192 conv_bench mnist_vendor pytorch mnist_hand mnist_graph resnet_gpu ${graph_precisions[*]/#/resnet_graph_} mp_gpu mp_cpu ${sanitize_tools[*]}"
for s in ${only//,/ }; do
  [[ " build test example bench sanitize report resnet_graph $steps_vocabulary " == *" $s "* ]] && continue
  if [[ "$s" =~ ^sanitize_([a-z]+)_(.+)$ && " ${sanitize_runs[*]} " == *" ${BASH_REMATCH[1]}:${BASH_REMATCH[2]} "* ]]; then
    continue
  fi
  die_usage "--only: unknown stage '$s' (build, test, example, bench, sanitize, report, resnet_graph, or one step: ${steps_vocabulary// /, }, sanitize_TOOL_PROGRAM)"
done
has_stage() { [[ ",$only," == *",$1,"* ]]; }
want() {  # want STEP STAGE: the step is selected (resnet_graph selects every resnet_graph_*)
  has_stage "$1" || has_stage "$2" || { [[ "$1" == resnet_graph_* ]] && has_stage resnet_graph; }
}
want_resnet_graph() {  # any of the resnet_graph_* steps
  local p
  for p in "${graph_precisions[@]}"; do want "resnet_graph_$p" bench && return 0; done
  return 1
}
want_sanitize() {  # want_sanitize TOOL PROGRAM: that sanitizer run is selected
  has_stage sanitize || has_stage "$1" || has_stage "sanitize_$1_$2"
}
# --print-targets: the targets alone on stdout (fd 3), everything else on stderr.
exec 3>&1
((print_targets)) && exec 1>&2

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

finish() {  # finish EXIT_CODE: writes the report, prints it and the commands to run next, exits
  write_report
  [[ -f "$report/report.md" ]] && { echo; cat "$report/report.md"; }
  say "report: $report/report.md and report.json"
  "$PYTHON" -c '
import json, sys
for c in json.load(open(sys.argv[1])).get("next_commands", []):
    print("gpu_check.sh: " + c["why"] + "\ngpu_check.sh:   " + c["command"])' "$report/report.json" 2>/dev/null
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
info_put sanitize_runs "${sanitize_runs[*]}"  # the report names whole tools in its commands

if ((print_targets)); then
  info_put gpu "not needed (--print-targets)"
elif [[ "${KILN_GPU_CHECK_ALLOW_NO_GPU:-0}" == 1 ]]; then
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

# MNIST (the bundle installed it; else datasets/fetch_mnist.sh, which needs the network), for the
# steps that read it: the tests (mnist_train's end-to-end runs), the MNIST trainings.
needs_mnist=0
for step in ctest_gpu:test ctest_gpu_vendor:test mnist_vendor:bench mnist_hand:bench mnist_graph:bench pytorch:bench; do
  want "${step%%:*}" "${step#*:}" && needs_mnist=1
done
((cpu_tests)) || has_stage ctest_cpu && needs_mnist=1
if ((needs_mnist && !print_targets)); then
  if ! bash datasets/fetch_mnist.sh >"$report/logs/mnist.log" 2>&1; then
    tail -n 3 "$report/logs/mnist.log" >&2
    prereq_fail "MNIST is not in datasets/mnist and cannot be downloaded here: make the bundle with tools/gpu_bundle.sh (it carries MNIST) and copy .gpu_bundle/ to this machine with the tree"
  fi
fi
record prerequisites ok 0 "$SECONDS" "" "GPU $(sed -n 's/^gpu=//p' "$info"), arch $arch"

# ---- 2. build --------------------------------------------------------------------------------
prefix_list=""  # CMAKE_PREFIX_PATH beyond the bundle's options
if ((${#extra_prefix[@]})); then  # the bundle's prefix is in bundle_args: repeat it before these
  prefix_list="${KILN_BUNDLE_ROOT:+$KILN_BUNDLE_ROOT/usr}"
  for p in "${extra_prefix[@]}"; do prefix_list="${prefix_list:+$prefix_list;}$p"; done
fi

# target_known T: the configured tree has the build target T (with Ninja, a target's output
# path, e.g. tests/cuda/ops_cuda_test, is one too).
ninja_query() {  # ninja_query T: what Ninja knows of T (the tree's own ninja)
  local mp
  mp=$(sed -n 's/^CMAKE_MAKE_PROGRAM:[A-Z]*=//p' "$build_dir/CMakeCache.txt" 2>/dev/null)
  "${mp:-ninja}" -C "$build_dir" -t query "$1" 2>/dev/null
}
make_help=""
target_known() {
  if [[ -f "$build_dir/build.ninja" ]]; then
    ninja_query "$1" >/dev/null
  else
    [[ -n "$make_help" ]] || make_help=$(cmake --build "$build_dir" --target help 2>/dev/null)
    grep -qE "^\.\.\. $1( |\$)" <<<"$make_help"
  fi
}

# ctest_programs LABEL: the programs of the build tree that the tests labelled LABEL run, relative
# to the tree (every word of a test's command, or value of a VAR=word, that is a file there:
# mpiexec's and env's programs too). ctest gives no command for a test whose program is not
# built yet, and the GoogleTest programs' tests are only known once the program is built (their
# discovery runs it), so on a fresh tree this finds little: the label target finds the rest.
ctest_programs() {
  ctest --test-dir "$build_dir" -L "$1" --show-only=json-v1 2>/dev/null | "$PYTHON" -c '
import json, os, sys
build = os.path.realpath(sys.argv[1])
try:
    tests = json.load(sys.stdin).get("tests", [])
except ValueError:
    tests = []
seen = set()
for t in tests:
    for word in t.get("command") or []:
        path = word.split("=", 1)[-1]
        if not os.path.isabs(path):
            continue
        path = os.path.realpath(path)
        if path.startswith(build + os.sep) and path not in seen:
            seen.add(path)
            print(os.path.relpath(path, build))
' "$build_dir"
}

# gpu_test_targets: the targets that build every gpu test's program: kiln_tests_gpu (the label
# target that kiln_test() and kiln_test_run() of tests/CMakeLists.txt make depend on each program
# of a test they label gpu) and each program ctest names for `-L gpu` (a test labelled gpu some
# other way, or a program built outside those functions).
gpu_test_targets() {
  local p
  target_known kiln_tests_gpu && echo kiln_tests_gpu
  while read -r p; do
    [[ -f "$build_dir/build.ninja" ]] || p=$(basename "$p")
    target_known "$p" && echo "$p"
  done < <(ctest_programs gpu)
}

# build_targets: the targets the chosen steps run, one a line, each known to the tree ("all" for
# the CPU suite; a benchmark the tree does not have is left to its step, which reports it missing).
build_targets() {
  local run t
  if ((cpu_tests)) || has_stage ctest_cpu; then echo all; return; fi
  {
    if want ctest_gpu test || want ctest_gpu_vendor test; then gpu_test_targets; fi
    for run in "${sanitize_runs[@]}"; do
      want_sanitize "${run%%:*}" "${run#*:}" && echo "${run#*:}"
    done
    want custom_layer example && printf '%s\n' kiln_engine kiln_layers kiln_data kiln_comm kiln_models kiln_pipeline
    { want gemm_bench bench || want gemm_steps bench || want gemm_steps_8192 bench; } && echo gemm_bench
    want conv_bench bench && echo conv_bench
    { want mnist_vendor bench || want mnist_hand bench || want mnist_graph bench; } && echo mnist_train
    { want resnet_gpu bench || want_resnet_graph; } && echo train_step_bench
    { want mp_gpu bench || want mp_cpu bench; } && echo resnet_bench
  } | awk '!seen[$0]++' | while read -r t; do
    if target_known "$t"; then echo "$t"; else say "no build target $t in $build_dir: left out" >&2; fi
  done
}

# check_gpu_tests: after the build, the gpu tests ctest knows and those whose program it cannot
# find (they would fail as "Could not find executable"): "COUNT MISSING NAMES...".
check_gpu_tests() {
  ctest --test-dir "$build_dir" -L gpu --show-only=json-v1 2>/dev/null | "$PYTHON" -c '
import json, sys
try:
    tests = json.load(sys.stdin).get("tests", [])
except ValueError:
    tests = []
missing = [t["name"] for t in tests if not t.get("command")]
print(len(tests), len(missing), " ".join(missing[:10]))'
}

configure_and_build() {
  run_step configure 180 cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" \
    "${bundle_args[@]}" ${prefix_list:+"-DCMAKE_PREFIX_PATH=$prefix_list"} || return 1
  # Every dependency found in the bundle, none in the machine's /usr (which would not be what we tested).
  if ((${#bundle_args[@]})); then
    local outside
    outside=$(grep -E '^(BLAS_[A-Za-z0-9]*_LIBRARY|CBLAS_INCLUDE_DIR|dnnl_DIR|OpenCL_LIBRARY|OpenCL_INCLUDE_DIR|GTest_DIR|CLI11_DIR|nlohmann_json_DIR|STB_INCLUDE_DIR|STB_LIBRARY)(:[A-Z]+)?=' \
              "$build_dir/CMakeCache.txt" | grep -v "=$KILN_BUNDLE_ROOT/" || true)
    if [[ -n "$outside" ]]; then
      say "warning: dependencies found outside the bundle:"
      printf '    %s\n' "$outside"
      echo "warning: dependencies found outside the bundle: $outside" >>"$report/logs/configure.log"
    fi
  fi
  local targets=()
  mapfile -t targets < <(build_targets)
  if ((print_targets)); then
    printf '%s\n' "${targets[@]}" >&3
    exit 0
  fi
  if ((${#targets[@]} == 0)); then
    record build ok 0 0 "" "nothing to build for the chosen steps"
  elif [[ " ${targets[*]} " == *" all "* ]]; then
    run_step build 600 cmake --build "$build_dir" -j "$(nproc)" || return 1
  else
    say "build targets: ${targets[*]}"
    run_step build 600 cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}" || return 1
  fi
  if want ctest_gpu test || want ctest_gpu_vendor test; then
    local n_tests n_missing missing_names
    read -r n_tests n_missing missing_names < <(check_gpu_tests)
    info_put gpu_tests "${n_tests:-0}"
    if ((${n_missing:-0} > 0)); then
      info_put gpu_tests_without_program "$n_missing: $missing_names"
      say "warning: $n_missing gpu tests have no built program (they will fail): $missing_names"
      echo "warning: $n_missing gpu tests have no built program: $missing_names" >>"$report/logs/build.log"
    fi
  fi
}

build_ok=0 no_build="the build failed"
if configure_and_build; then
  build_ok=1
elif ((print_targets)); then
  say "error: the configure step did not succeed (logs/configure.log)"
  exit 2
fi
awk -F'\t' '($1 == "configure" || $1 == "build") && $2 == "skipped" {s = 1} END {exit !s}' "$steps" &&
  no_build="not built: out of time"

# ---- 3. tests --------------------------------------------------------------------------------
# As many tests at once as there are cores. No gpu test needs the GPU to itself: none measures
# time against a tight bound (the loader's stream holds allow 2 and 10 s), none fills the GPU's
# memory (the out-of-memory test asks for 1 PiB), and the ones that need a second GPU skip on
# one. A test that must run alone would say so itself, with the ctest property RUN_SERIAL (or
# RESOURCE_LOCK gpu) in its CMakeLists.txt, which these runs obey. Each program gets
# OMP_NUM_THREADS=2, not a thread per core, so many programs at once do not oversubscribe the
# CPU. ctest writes every test's output to REPORT_DIR/STEP.junit.xml: the report quotes the failed
# ones.
omp_threads=${OMP_NUM_THREADS:-2}
ctest_run() {  # ctest_run STEP CAP [VAR=value...] CTEST_ARGS...: one ctest run as a step
  local step=$1 cap=$2 envs=()
  shift 2
  while [[ $# -gt 0 && "$1" == *=* && "$1" != -* ]]; do envs+=("$1"); shift; done
  rm -f "$report/$step.junit.xml"
  run_step "$step" "$cap" env OMP_NUM_THREADS="$omp_threads" "${envs[@]}" ctest --test-dir "$build_dir" \
    --output-on-failure --output-junit "$report/$step.junit.xml" "$@"
}
if want ctest_gpu test; then
  if ((build_ok)); then
    ctest_run ctest_gpu 240 KILN_KERNELS=hand -L gpu --no-tests=error --timeout "$test_timeout" -j "$(nproc)"
  else
    record ctest_gpu skipped - 0 "" "$no_build"
  fi
fi
# The same tests through cuBLAS and cuDNN: every CUDA op that has a vendor path takes it.
if want ctest_gpu_vendor test; then
  if ((build_ok)); then
    ctest_run ctest_gpu_vendor 240 KILN_KERNELS=vendor -L gpu --no-tests=error --timeout "$test_timeout" -j "$(nproc)"
  else
    record ctest_gpu_vendor skipped - 0 "" "$no_build"
  fi
fi
if ((cpu_tests)) || has_stage ctest_cpu; then
  if ((build_ok)); then
    ctest_run ctest_cpu 300 -LE 'gpu|sim' --timeout 300 -j "$(nproc)"
  else
    record ctest_cpu skipped - 0 "" "$no_build"
  fi
fi

# ---- 4. the example, built against this build installed -------------------------------------
# custom_layer_job BUILD_DIR WORK REQUIRE_GPU JOBS SOURCE CMAKE_ARGS...: installs BUILD_DIR into
# WORK/prefix (cmake --install), configures and builds the example at SOURCE in WORK/build with
# the CMake arguments (generator, nvcc, the dependencies' options, CMAKE_PREFIX_PATH with the
# prefix first) and runs its tests; with REQUIRE_GPU=1 none may skip (its CUDA tests skip only
# without a device). A function run by `bash -c` (exported), so run_step's timeout applies.
# shellcheck disable=SC2317  # called through bash -c
custom_layer_job() {
  local build=$1 work=$2 require_gpu=$3 jobs=$4 src=$5 rc=0
  shift 5
  set -e
  rm -rf "$work/prefix"
  echo "== cmake --install $build --prefix $work/prefix"
  cmake --install "$build" --prefix "$work/prefix" | tail -n 3
  echo "== cmake -S $src -B $work/build $*"
  cmake -S "$src" -B "$work/build" "$@"
  cmake --build "$work/build" -j "$jobs"
  echo "== ctest --test-dir $work/build"
  ctest --test-dir "$work/build" --output-on-failure --no-tests=error --timeout 300 -j "$jobs" >"$work/ctest.log" 2>&1 || rc=$?
  cat "$work/ctest.log"
  ((rc == 0)) || return "$rc"
  if ((require_gpu)) && grep -q '\*\*\*Skipped' "$work/ctest.log"; then
    echo "error: tests skipped on a machine with a GPU: the example's CUDA tests must run here"
    return 1
  fi
}
if want custom_layer example; then
  if ((build_ok)); then
    export -f custom_layer_job
    require_gpu=1
    [[ "${KILN_GPU_CHECK_ALLOW_NO_GPU:-0}" == 1 ]] && require_gpu=0
    work="$build_dir/.custom-layer"
    # The installed Kiln first, then what the build itself found its dependencies through.
    example_prefix="$work/prefix"
    if [[ -n "$prefix_list" ]]; then
      example_prefix+=";$prefix_list"
    elif [[ -n "${KILN_BUNDLE_ROOT:-}" ]]; then
      example_prefix+=";$KILN_BUNDLE_ROOT/usr"
    fi
    run_step custom_layer 300 bash -c 'custom_layer_job "$@"' custom_layer_job "$build_dir" "$work" \
      "$require_gpu" "$(nproc)" "$root/examples/custom_layer" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" "${bundle_args[@]}" "-DCMAKE_PREFIX_PATH=$example_prefix"
  else
    record custom_layer skipped - 0 "" "$no_build"
  fi
fi

# ---- 5. benchmarks ---------------------------------------------------------------------------
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
  bench_flags_missing "$name" "$bin" "$@" && return
  run_step "$name" "$cap" "$bin" "$@"
}
# bench_flags_missing NAME BINARY FLAGS...: true (and NAME recorded missing) if the program's
# --help lacks one of the flags (the flag is not written yet, or not in this build).
bench_flags_missing() {
  local name=$1 bin=$2 flag help
  shift 2
  help=$("$bin" --help 2>&1)
  for flag in "$@"; do
    [[ "$flag" == --* ]] || continue
    if [[ "$help" != *"${flag%%=*}"* ]]; then
      record "$name" missing - 0 "" "${bin#"$root"/} has no ${flag%%=*} option yet (not built yet)"
      say "$name: MISSING (${bin#"$root"/} has no ${flag%%=*})"
      return 0
    fi
  done
  return 1
}

run_mnist() {  # run_mnist hand|vendor
  rm -f "$report/mnist_$1.json"
  run_step "mnist_$1" 200 "$build_dir/apps/mnist_train" --device cuda --epochs "$epochs" --kernels "$1" \
    --json "$report/mnist_$1.json"
}

# PyTorch runs in the machine's own library environment, without the bundle's (pt_env: the
# words of PYTHON for tools/bench_resnet_vs_pytorch.sh).
if [[ -n "$orig_ld_library_path" ]]; then pt_env="env LD_LIBRARY_PATH=$orig_ld_library_path"; else pt_env="env -u LD_LIBRARY_PATH"; fi
bench_steps=(gemm_bench gemm_steps gemm_steps_8192 conv_bench mnist_vendor pytorch mnist_hand mnist_graph resnet_gpu
             "${graph_precisions[@]/#/resnet_graph_}" mp_gpu mp_cpu)
for step in "${bench_steps[@]}"; do
  want "$step" bench || continue
  if ((!build_ok)); then
    record "$step" skipped - 0 "" "$no_build"
    continue
  fi
  case "$step" in
    gemm_bench)
      # hand/vendor (f32), and the tensor-core steps 4-7 on bf16 over cublasGemmEx on the same
      # inputs at every size: gemm_bench prints tc_bf16/vendor_bf16, sm90_bf16/vendor_bf16,
      # sm90ws_bf16/vendor_bf16, sm90p_bf16/vendor_bf16 and each step over the one before per
      # size (the Hopper steps are skipped, saying why, on a GPU other than 9.0, and a step not
      # in this build says so).
      rm -f "$report/gemm_bench.json"
      bench_program gemm_bench "$build_dir/apps/gemm_bench" 240 --device cuda --sizes 1024,2048,4096,8192 \
        --kernels hand,vendor,tc_bf16,sm90_bf16,sm90ws_bf16,sm90p_bf16,vendor_bf16 --json "$report/gemm_bench.json" ;;
    gemm_steps|gemm_steps_8192)
      # The ladder: every step (f32 steps 1-3; tensor cores: 4 WMMA, 5 Hopper TMA + wgmma, 6
      # warp-specialised, 7 persistent; bf16 and f16 inputs) against cuBLAS SGEMM and
      # cublasGemmEx on the same bf16 inputs, at 2048^3 and 4096^3 (10 timed products each),
      # then at 8192^3 in a step of its own with 3 timed products after 1 warm-up: there the
      # naive and tiled steps take about 0.2 s a product (5-6 TFLOP/s on an H200), and the
      # host's inputs, references and checks of 256 MiB matrices most of the step's time. The
      # report's targets: step 5 >= 0.55 x cublasGemmEx at 4096^3, step 7 >= 0.8 x at 4096^3
      # and 8192^3.
      rm -f "$report/$step.json"
      if [[ "$step" == gemm_steps ]]; then size_args=(--sizes 2048,4096 --iters 10) cap=120
      else size_args=(--sizes 8192 --iters 3 --warmup 1) cap=150; fi
      bench_program "$step" "$build_dir/apps/gemm_bench" "$cap" --device cuda "${size_args[@]}" \
        --kernels naive,tiled,regblock,tc_bf16,tc_f16,sm90_bf16,sm90_f16,sm90ws_bf16,sm90ws_f16,sm90p_bf16,sm90p_f16,vendor,vendor_bf16 \
        --json "$report/$step.json" ;;
    conv_bench) bench_program conv_bench "$build_dir/apps/conv_bench" 150 --device cuda --shapes resnet50 ;;
    mnist_vendor) run_mnist vendor ;;
    mnist_hand) run_mnist hand ;;
    mnist_graph)
      # The fast recipe (Adam, one-cycle, bf16, 3 epochs) with the training step as one CUDA
      # graph and MNIST held on the GPU: the report gives the seconds of training to 99.0%.
      rm -f "$report/mnist_graph.json"
      bench_program mnist_graph "$build_dir/apps/mnist_train" 200 --device cuda --recipe fast --cuda-graph \
        --data-on-device --json "$report/mnist_graph.json" ;;
    resnet_gpu)
      # Kiln eager against PyTorch eager (NCHW, cudnn.benchmark), TF32 off and on, bf16, fp16:
      # Kiln with the bundle's libraries, PyTorch in the machine's own environment.
      run_step resnet_gpu 240 env KILN_BUILD_DIR="$build_dir" PYTHON="$pt_env $PYTHON" PYTHONUNBUFFERED=1 \
        KILN_BENCH_RUNNERS=kiln,pytorch "$root/tools/bench_resnet_vs_pytorch.sh" 2 1 cuda:0 ;;
    resnet_graph_*)
      # One precision: ResNet-50 training at 128x128 batch 32 and 224x224 batch 128, one round
      # of Kiln eager, PyTorch eager NCHW, Kiln --cuda-graph, PyTorch eager channels_last, Kiln
      # channels-last (--memory-format channels_last) and PyTorch torch.compile
      # (reduce-overhead, channels_last; compiled once per workload, the compilation untimed). The script starts no workload that would not end before its
      # deadline, some seconds inside the step's timeout; one left out makes the step partial.
      rm -f "$report/$step.json"
      bin="$build_dir/apps/train_step_bench"
      if [[ ! -x "$bin" ]]; then
        record "$step" missing - 0 "" "${bin#"$root"/} is not built (not written yet, or not in this build)"
        say "$step: MISSING (${bin#"$root"/} is not built)"
        continue
      fi
      bench_flags_missing "$step" "$bin" --cuda-graph && continue
      cap=210 left=$((budget - SECONDS - 15))
      t=$((cap < left ? cap : left))
      run_step "$step" "$cap" env KILN_BUILD_DIR="$build_dir" PYTHON="$pt_env $PYTHON" PYTHONUNBUFFERED=1 \
        KILN_BENCH_JSON="$report/$step.json" KILN_BENCH_SECONDS=$((t > 40 ? t - 20 : 20)) \
        "$root/tools/bench_resnet_vs_pytorch.sh" 1 1 cuda:0 "${step#resnet_graph_}" 128:32,224:128
      left_out=$("$PYTHON" -c 'import json, sys
print(sum("out of time" in n for n in json.load(open(sys.argv[1])).get("not_run", [])))' "$report/$step.json" 2>/dev/null)
      if [[ "${left_out:-0}" != 0 ]] && awk -F'\t' -v n="$step" '$1 == n && $2 == "ok" {f = 1} END {exit !f}' "$steps"; then
        record "$step" partial 0 "$(awk -F'\t' -v n="$step" '$1 == n {print $4}' "$steps")" "logs/$step.log" \
          "$left_out of its 2 workloads left out for time: run it again with --only $step"
        say "$step: PARTIAL ($left_out workloads left out for time)"
        budget_skipped=1
      fi ;;
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
      rm -f "$report/pytorch.json"
      if [[ -n "$orig_ld_library_path" ]]; then pt_env_words=(env "LD_LIBRARY_PATH=$orig_ld_library_path"); else pt_env_words=(env -u LD_LIBRARY_PATH); fi
      run_step pytorch 200 "${pt_env_words[@]}" PYTHONUNBUFFERED=1 "$PYTHON" "$root/tools/pytorch_mnist.py" --device cuda \
        --epochs "$epochs" --json "$report/pytorch.json" ;;
  esac
done

# ---- 6. compute-sanitizer --------------------------------------------------------------------
# Each selected run of sanitize_runs: `compute-sanitizer --tool TOOL --error-exitcode 86 PROGRAM`
# under a time cap (--sanitize-timeout, and what the budget leaves), several at once (a quarter
# of the cores: the tools are CPU-heavy too). First, once, the tool itself: found, and a trivial
# kernel (built here with nvcc) clean under memcheck; if not, every run is recorded missing, with
# why. Tests that timed out in this report directory's ctest_gpu run are left out of the runs
# (--gtest_filter=-...: a hang under a sanitizer only hangs longer).
sanitizer_probe() {  # sets sanitizer (the tool), or no_sanitizer (why it cannot be used here)
  local dir="$build_dir/.sanitizer-probe" plog="$report/logs/compute_sanitizer.log" arch_flag=() c
  sanitizer="" no_sanitizer=""
  for c in "$(command -v compute-sanitizer 2>/dev/null)" "$cuda_home/bin/compute-sanitizer" \
           "$cuda_home/compute-sanitizer/compute-sanitizer"; do
    if [[ -n "$c" && -x "$c" ]]; then sanitizer=$c; break; fi
  done
  if [[ -z "$sanitizer" ]]; then
    no_sanitizer="compute-sanitizer not found (not on PATH, not in $cuda_home)"
    echo "$no_sanitizer" >"$plog"
    return 1
  fi
  mkdir -p "$dir"
  cat >"$dir/probe.cu" <<'PROBE'
// Clean under every tool: each thread writes its shared slot, meets the others at the barrier,
// reads a neighbour's slot and writes one element in bounds.
#include <cstdio>
__global__ void fill(int* out, int n) {
  __shared__ int slot[128];
  slot[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = slot[(threadIdx.x + 1) % blockDim.x];
}
int main() {
  const int n = 1000;
  int* out = nullptr;
  if (cudaMalloc(&out, n * sizeof(int)) != cudaSuccess) return 1;
  fill<<<(n + 127) / 128, 128>>>(out, n);
  const cudaError_t e = cudaDeviceSynchronize();
  cudaFree(out);
  std::printf("probe: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
PROBE
  [[ "$arch" =~ ^[0-9]+$ ]] && arch_flag=("-arch=sm_$arch")
  {
    echo "\$ $sanitizer --version"
    timeout 30 "$sanitizer" --version
    echo "\$ nvcc ${arch_flag[*]} -o $dir/probe $dir/probe.cu"
    timeout 120 nvcc "${arch_flag[@]}" -o "$dir/probe" "$dir/probe.cu"
    echo "\$ $sanitizer --tool memcheck --error-exitcode 86 $dir/probe"
    timeout 60 "$sanitizer" --tool memcheck --error-exitcode 86 "$dir/probe"
    echo "exit code $?"
  } >"$plog" 2>&1
  if ! grep -q '^exit code 0$' "$plog" || ! grep -q 'ERROR SUMMARY: 0 errors' "$plog"; then
    no_sanitizer="compute-sanitizer ($sanitizer) does not work here: a trivial kernel under memcheck gave: $(grep -v '^\$' "$plog" | tail -n 2 | paste -sd' ' -)"
    return 1
  fi
  info_put compute_sanitizer "$(timeout 30 "$sanitizer" --version 2>/dev/null | grep -i version | head -n 1)"
}

program_path() {  # program_path TARGET: the program the target builds, or nothing
  local p=""
  [[ -f "$build_dir/build.ninja" ]] && p=$(ninja_query "$1" | awk '/^  input: phony/ {getline; print $1; exit}')
  if [[ -n "$p" && -x "$build_dir/$p" ]]; then echo "$build_dir/$p"; return; fi
  find "$build_dir" -type f -name "$1" -perm -u+x 2>/dev/null | head -n 1
}

sanitize_one() {  # sanitize_one NAME TOOL PROGRAM SECONDS: one run (in the background)
  local log="$report/logs/$1.log" start rc
  start=$(date +%s)
  {
    echo "\$ compute-sanitizer --tool $2 --error-exitcode 86 ${3#"$root"/}${hung:+ --gtest_filter=-$hung}"
    OMP_NUM_THREADS="$omp_threads" timeout -k 10 "$4" "$sanitizer" --tool "$2" --error-exitcode 86 "$3" \
      ${hung:+"--gtest_filter=-$hung"}
  } >"$log" 2>&1
  rc=$?
  echo "$rc $(($(date +%s) - start)) $4" >"$sdir/$1.rc"
}

# sanitize_outcome LOG RC SECONDS_CAP: "STATUS<TAB>NOTE" of a finished run, from its summary line
# ("ERROR SUMMARY: N errors", or racecheck's "RACECHECK SUMMARY: N hazards displayed (E errors,
# W warnings)") and exit code (86: errors; 124/137: stopped at the cap).
sanitize_outcome() {
  local log=$1 rc=$2 cap=$3 summary errors shown
  summary=$(grep -E 'ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard' "$log" | tail -n 1 | sed 's/^=* *//')
  errors=$(sed -nE 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/p; s/.*RACECHECK SUMMARY: .*\(([0-9]+) error.*/\1/p' <<<"$summary")
  shown=$(grep -cE '^=+ +(Invalid|Error|Barrier|Uninitialized|Program hit|Malloc|Race)' "$log")
  if ((rc == 124 || rc == 137)); then
    if ((shown > 0)); then
      printf 'failed\tstopped at the time cap (%ss); %s error reports before' "$cap" "$shown"
    else
      printf 'partial\tstopped at the time cap (%ss), no error reported before' "$cap"
    fi
  elif [[ -z "$summary" ]]; then
    printf 'failed\tno sanitizer summary (exit code %s): see the log' "$rc"
  elif ((${errors:-0} > 0 || rc == 86)); then
    printf 'failed\t%s' "$summary"
  elif ((rc != 0)); then
    printf 'failed\t%s; the program failed (exit code %s): see the log' "$summary" "$rc"
  else
    printf 'ok\t%s' "$summary"
  fi
}

selected_runs=()
for run in "${sanitize_runs[@]}"; do
  want_sanitize "${run%%:*}" "${run#*:}" && selected_runs+=("$run")
done
if ((${#selected_runs[@]})); then
  sanitizer="" no_sanitizer=""
  if ((build_ok)); then
    probe_start=$SECONDS
    if sanitizer_probe; then
      record compute_sanitizer ok 0 "$((SECONDS - probe_start))" logs/compute_sanitizer.log "$(sed -n 's/^compute_sanitizer=//p' "$info")"
    else
      say "sanitize: $no_sanitizer"
      record compute_sanitizer missing - "$((SECONDS - probe_start))" logs/compute_sanitizer.log "$no_sanitizer"
    fi
  fi
  hung=$(sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (Timeout).*/\1/p' "$report/logs/ctest_gpu.log" 2>/dev/null | sort -u | paste -sd: -)
  sdir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-sanitize.XXXXXX")
  sanitize_jobs=$(($(nproc) / 4))
  ((sanitize_jobs >= 1)) || sanitize_jobs=1
  launched=()
  for run in "${selected_runs[@]}"; do
    tool=${run%%:*} prog=${run#*:}
    name="sanitize_${tool}_${prog}"
    if ((!build_ok)); then record "$name" skipped - 0 "" "$no_build"; continue; fi
    if [[ -n "$no_sanitizer" ]]; then record "$name" missing - 0 "" "$no_sanitizer"; continue; fi
    bin=$(program_path "$prog")
    if [[ -z "$bin" ]]; then record "$name" missing - 0 "" "$prog is not built (no such program in this build)"; continue; fi
    while (($(jobs -rp | wc -l) >= sanitize_jobs)); do wait -n; done
    left=$((budget - SECONDS - 15))
    if ((left < 30)); then
      record "$name" skipped - 0 "" "out of time (budget ${budget}s): run again with --only and the same report directory"
      say "$name: SKIPPED (out of time)"
      budget_skipped=1
      continue
    fi
    t=$((sanitize_timeout < left ? sanitize_timeout : left))
    say "$name: compute-sanitizer --tool $tool ${bin#"$root"/} (timeout ${t}s, log logs/$name.log)"
    sanitize_one "$name" "$tool" "$bin" "$t" &
    launched+=("$name")
  done
  wait
  for name in "${launched[@]}"; do
    read -r rc secs cap <"$sdir/$name.rc" || { rc=1 secs=0 cap=0; }
    IFS=$'\t' read -r status note < <(sanitize_outcome "$report/logs/$name.log" "$rc" "$cap")
    record "$name" "$status" "$rc" "$secs" "logs/$name.log" "$note"
    say "$name: ${status^^} (${secs} s, $note)"
    [[ "$status" == failed ]] && failed=1
    [[ "$status" == partial ]] && budget_skipped=1
  done
  rm -rf "$sdir"
fi

# ---- 7. report -------------------------------------------------------------------------------
# The report ends with the commands that run what was skipped, cut or lacked a tool (finish
# prints them last): with exit code 3, run the first at once (the machine stays warm ~30 s).
if ((failed)); then
  finish 1
elif ((budget_skipped)); then
  say "out of time: some steps were skipped or cut; run the command below at once, same report directory"
  finish 3
fi
finish 0
