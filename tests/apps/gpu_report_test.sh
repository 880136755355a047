#!/usr/bin/env bash
# gpu_report_test.sh: tools/gpu_report.py renders a report from a made-up REPORT_DIR of
# tools/gpu_check.sh (no GPU needed): failed tests with their output (from the JUnit file, and from
# the log when there is none), sanitizer runs that passed, failed, were cut at their time cap,
# skipped for time or lacked the tool, the example, the Hopper GEMM steps' ratios, the GEMM
# ladder of steps 1-7 with its targets (from a full run, an older one without steps 6 and 7, and
# one on a GPU other than compute capability 9.0), and the section of what was not run with the
# commands that run it next. Then tools/gpu_check.sh's argument
# checks and, on a machine without an NVIDIA driver, its quick exit 2.
# Usage: tests/apps/gpu_report_test.sh SOURCE_DIR   (exit 77: no python3, skipped)
set -uo pipefail
root=${1:?usage: gpu_report_test.sh SOURCE_DIR}
python=${PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 || { echo "no $python: skipped"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-gpu-report.XXXXXX")
trap 'rm -rf "$dir"' EXIT
failed=0
fail() { echo "FAIL: $*" >&2; failed=$((failed + 1)); }

# ---- the made-up report directory ----------------------------------------------------------
mkdir -p "$dir/logs"
cat >"$dir/info.txt" <<'EOF'
date=2026-11-27T22:31:15Z
commit=0123456789abcdef
changed_files=0
commit_source=git
gpu=NVIDIA H200
driver=580.159.04
cpus=16
gpu_tests=589
compute_sanitizer=Version 2025.3.1
EOF
step() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$dir/steps.tsv"; }
step prerequisites ok 0 3 "" "GPU NVIDIA H200, arch 90"
step configure ok 0 8 logs/configure.log ""
step build ok 0 32 logs/build.log ""
step ctest_gpu failed 8 95 logs/ctest_gpu.log "exit code 8"
step ctest_gpu_vendor failed 8 97 logs/ctest_gpu_vendor.log "exit code 8"
step custom_layer ok 0 41 logs/custom_layer.log ""
step gemm_bench ok 0 60 logs/gemm_bench.log ""
step gemm_steps skipped - 0 "" "out of time (budget 540s): run again with --only and the same report directory"
step compute_sanitizer ok 0 6 logs/compute_sanitizer.log "Version 2025.3.1"
step sanitize_memcheck_ops_cuda_test ok 0 21 logs/sanitize_memcheck_ops_cuda_test.log "ERROR SUMMARY: 0 errors"
step sanitize_racecheck_gemm_cuda_test failed 86 33 logs/sanitize_racecheck_gemm_cuda_test.log \
  "RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"
step sanitize_synccheck_conv2d_cuda_test partial 124 120 logs/sanitize_synccheck_conv2d_cuda_test.log \
  "stopped at the time cap (120s), no error reported before"
step sanitize_initcheck_ops_cuda_test skipped - 0 "" "out of time (budget 540s): run again with --only and the same report directory"
step sanitize_initcheck_loader_cuda_test missing - 0 "" "compute-sanitizer not found (not on PATH, not in /usr/local/cuda)"

# ctest's log (--output-on-failure) and JUnit file for ctest_gpu; the vendor run has only its log.
ctest_log() {
  cat <<'EOF'
$ env OMP_NUM_THREADS=2 ctest --test-dir build-gpu --output-on-failure -L gpu -j 16
Test project build-gpu
        Start  38: LoaderCuda.DroppedBatchStaysIntactForQueuedCompute
        Start 131: GemmLowpCuda.HandIsTheF32HandGemmOnWidenedInputs
  1/589 Test #131: GemmLowpCuda.HandIsTheF32HandGemmOnWidenedInputs ........***Failed    1.19 sec
Running main() from gtest_main.cc
tests/cuda/gemm_lowp_cuda_test.cpp:139: Failure
Value of: bit_identical(dtype_name(in), got, want)
  Actual: false (bf16: element 5 of [130, 33] is -3.6619498729705811 on cuda:0, -3.6619501113891602 on cuda:0)
[  FAILED  ] GemmLowpCuda.HandIsTheF32HandGemmOnWidenedInputs (289 ms)
        Start 107: OpsCuda.SecondDeviceGivesTheSameBits
  2/589 Test #107: OpsCuda.SecondDeviceGivesTheSameBits ....................***Skipped   0.14 sec
  3/589 Test  #38: LoaderCuda.DroppedBatchStaysIntactForQueuedCompute ......***Timeout  90.10 sec
Running main() from gtest_main.cc
[ RUN      ] LoaderCuda.DroppedBatchStaysIntactForQueuedCompute

99% tests passed, 2 tests failed out of 589

The following tests did not run:
	107 - OpsCuda.SecondDeviceGivesTheSameBits (Skipped)

The following tests FAILED:
	 38 - LoaderCuda.DroppedBatchStaysIntactForQueuedCompute (Timeout) gpu loader
	131 - GemmLowpCuda.HandIsTheF32HandGemmOnWidenedInputs (Failed) gpu
Errors while running CTest
EOF
}
ctest_log >"$dir/logs/ctest_gpu.log"
ctest_log >"$dir/logs/ctest_gpu_vendor.log"
{
  cat <<'EOF'
<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="3" failures="2" disabled="0" skipped="1" hostname="" time="95">
	<testcase name="LoaderCuda.DroppedBatchStaysIntactForQueuedCompute" classname="x" time="90.1" status="fail">
		<failure message=""/>
		<system-out>[ RUN      ] LoaderCuda.DroppedBatchStaysIntactForQueuedCompute
</system-out>
	</testcase>
	<testcase name="GemmLowpCuda.HandIsTheF32HandGemmOnWidenedInputs" classname="x" time="1.19" status="fail">
		<failure message=""/>
		<system-out>JUNIT-OUTPUT begins
Value of: bit_identical(dtype_name(in), got, want) &amp;&amp; more
EOF
  for i in $(seq 1 150); do echo "  Actual: false (line $i of a long failure)"; done
  cat <<'EOF'
JUNIT-OUTPUT ends
</system-out>
	</testcase>
	<testcase name="OpsCuda.SecondDeviceGivesTheSameBits" classname="x" time="0.14" status="notrun">
		<skipped message="Skipped"/>
		<system-out>skipped: needs 2 CUDA devices, this machine has 1</system-out>
	</testcase>
</testsuite>
EOF
} >"$dir/ctest_gpu.junit.xml"

cat >"$dir/logs/custom_layer.log" <<'EOF'
$ bash -c custom_layer_job "$@" custom_layer_job build-gpu
== ctest --test-dir build-gpu/.custom-layer/build
1/2 Test #1: SwishCuda.MatchesCpu .............   Passed    0.90 sec
2/2 Test #2: train_swish_runs .................   Passed    0.40 sec

100% tests passed, 0 tests failed out of 2
EOF
cat >"$dir/logs/sanitize_memcheck_ops_cuda_test.log" <<'EOF'
$ compute-sanitizer --tool memcheck --error-exitcode 86 build-gpu/tests/cuda/ops_cuda_test
========= COMPUTE-SANITIZER
[  PASSED  ] 4 tests.
========= ERROR SUMMARY: 0 errors
EOF
cat >"$dir/logs/sanitize_racecheck_gemm_cuda_test.log" <<'EOF'
$ compute-sanitizer --tool racecheck --error-exitcode 86 build-gpu/tests/cuda/gemm_cuda_test
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at tiled_gemm(...)+0x1a0 in gemm.cu:88
=========     and Read access at tiled_gemm(...)+0x2c0 in gemm.cu:95 [128 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
EOF
cat >"$dir/logs/sanitize_synccheck_conv2d_cuda_test.log" <<'EOF'
$ compute-sanitizer --tool synccheck --error-exitcode 86 build-gpu/tests/cuda/conv2d_cuda_test
========= COMPUTE-SANITIZER
[ RUN      ] Conv2dCuda.LargeShapes
EOF

# ---- render, then check ----------------------------------------------------------------------
# gemm_bench's log and JSON: step 5 over cublasGemmEx and over step 4, per size.
cat >"$dir/logs/gemm_bench.log" <<'EOF'
$ build-gpu/apps/gemm_bench --device cuda --sizes 1024,4096 --kernels tc_bf16,sm90_bf16,vendor_bf16
N   1024  sm90_bf16   bf16   300000.0 GFLOP/s      0.007 ms  max err 1.0e-07
EOF
cat >"$dir/gemm_bench.json" <<'EOF'
{"hand_over_vendor": [{"size": 1024, "sm90_bf16_over_vendor_bf16": 0.41},
                      {"size": 1024, "sm90_bf16_over_tc_bf16": 2.5},
                      {"size": 4096, "sm90_bf16_over_vendor_bf16": 0.62}]}
EOF
if ! "$python" "$root/tools/gpu_report.py" "$dir" 3 >"$dir/render.log" 2>&1; then
  cat "$dir/render.log" >&2
  fail "tools/gpu_report.py exited non-zero"
fi
md="$dir/report.md"
expect() {  # expect TEXT: report.md holds TEXT (a fixed string)
  grep -qF -- "$1" "$md" || fail "report.md lacks: $1"
}
expect_not() {
  if grep -qF -- "$1" "$md"; then fail "report.md holds: $1"; fi
}
expect "gpu tests in this build: 589 · compute-sanitizer Version 2025.3.1"
expect "## Not run, or not finished"
expect "| gemm_steps | skipped | out of time"
expect "| sanitize_synccheck_conv2d_cuda_test | partial | stopped at the time cap"
expect "tools/gpu_check.sh $dir --only gemm_steps,sanitize_synccheck_conv2d_cuda_test,sanitize_initcheck_ops_cuda_test --sanitize-timeout 480"
expect "To run the sanitizer runs that found no working compute-sanitizer"
expect "tools/gpu_check.sh $dir --only sanitize_initcheck_loader_cuda_test"
# The failed tests' output: ctest_gpu's from the JUnit file (XML entities decoded, trimmed), the
# vendor run's from its log.
expect "Output of GemmLowpCuda.HandIsTheF32HandGemmOnWidenedInputs (Failed):"
expect "Output of LoaderCuda.DroppedBatchStaysIntactForQueuedCompute (Timeout):"
expect "JUNIT-OUTPUT begins"
expect "got, want) && more"
expect "lines left out: the whole output is in the log"
expect "JUNIT-OUTPUT ends"
expect_not "line 100 of a long failure"
expect "tests/cuda/gemm_lowp_cuda_test.cpp:139: Failure"
[[ $(grep -cF "Output of GemmLowpCuda.HandIsTheF32HandGemmOnWidenedInputs (Failed):" "$md") -eq 2 ]] ||
  fail "the failed test's output should appear once per ctest run (2)"
# The sanitizers.
expect "| memcheck | ops_cuda_test | ok | 21 | ERROR SUMMARY: 0 errors |"
expect "| racecheck | gemm_cuda_test | failed | 33 | RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings) |"
expect "| synccheck | conv2d_cuda_test | partial | 120 | stopped at the time cap (120s), no error reported before |"
expect "| initcheck | loader_cuda_test | missing | 0 | compute-sanitizer not found"
expect "========= Error: Race reported between Write access"
# Step 5's ratios, with step 4's where the JSON has it.
expect "(step 5, TMA and wgmma, over cublasGemmEx, same bf16 inputs), N = 1024: 0.41 (over step 4: 2.50)."
expect "(step 5, TMA and wgmma, over cublasGemmEx, same bf16 inputs), N = 4096: 0.62."
# The example.
expect "## examples/custom_layer against this build installed"
expect "100% tests passed, 0 tests failed out of 2"
# report.json agrees.
"$python" - "$dir/report.json" <<'EOF' || fail "report.json"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] is False, r["ok"]
assert [s["tool"] for s in r["sanitizers"]] == ["memcheck", "racecheck", "synccheck", "initcheck", "initcheck"]
assert len(r["tests"]["gpu"]["failed_output"]) == 2
assert r["tests"]["gpu"]["skipped"] == 1
assert len(r["next_commands"]) == 2
EOF

# Every run of a tool in the command: the tool's name instead (gpu_check.sh lists its runs in
# info.txt); here synccheck has one run, cut at its cap.
echo "sanitize_runs=memcheck:ops_cuda_test racecheck:gemm_cuda_test synccheck:conv2d_cuda_test initcheck:ops_cuda_test initcheck:loader_cuda_test" >>"$dir/info.txt"
"$python" "$root/tools/gpu_report.py" "$dir" 3 || fail "tools/gpu_report.py exited non-zero (second report)"
expect "tools/gpu_check.sh $dir --only gemm_steps,sanitize_initcheck_ops_cuda_test,synccheck --sanitize-timeout 480"

# The CUDA-graph steps: mnist_graph's JSON (99.0% first reached after epoch 2), resnet_graph_*'s
# (one ok, one cut for time, two skipped; then all four to run again: the command names the
# group, resnet_graph).
step mnist_graph ok 0 25 logs/mnist_graph.log ""
cat >"$dir/mnist_graph.json" <<'EOF'
{"recipe": "fast", "epochs": 3, "batch_size": 128, "precision": "bf16", "test_accuracy": 0.9921,
 "test_accuracy_per_epoch": [0.9801, 0.9904, 0.9921], "train_seconds_per_epoch": [2.5, 2.5, 2.0],
 "train_seconds": 6.75, "train_images_per_sec": 26000}
EOF
step resnet_graph_fp32 ok 0 150 logs/resnet_graph_fp32.log ""
step resnet_graph_tf32 partial 0 190 logs/resnet_graph_tf32.log "1 of its 2 workloads left out for time: run it again with --only resnet_graph_tf32"
step resnet_graph_bf16 skipped - 0 "" "out of time (budget 540s): run again with --only and the same report directory"
step resnet_graph_fp16 skipped - 0 "" "out of time (budget 540s): run again with --only and the same report directory"
cat >"$dir/resnet_graph_fp32.json" <<'EOF'
{"configs": [{"model": "resnet50", "image": 128, "batch": 32, "precision": "fp32", "rounds": 1,
  "images_per_sec": {"kiln": 1100.0, "kiln[graph]": 1500.0, "pytorch[eager]": 1480.0,
                     "pytorch[eager+nhwc]": 1600.0, "pytorch[compile+nhwc]": 2000.0},
  "ms_per_step": {}, "ratios": {"kiln[graph] / pytorch eager best": 0.9375,
                                "kiln[graph] / pytorch[compile+nhwc]": 0.75},
  "kiln_launches": {"kiln": {"kernel_launches_per_step": 912, "enqueue_ms_per_step": 9.5},
                    "kiln[graph]": {"kernel_launches_per_step": 1, "enqueue_ms_per_step": 0.02}}}],
 "not_run": [], "failed": []}
EOF
cat >"$dir/resnet_graph_tf32.json" <<'EOF'
{"configs": [], "not_run": ["224:128 tf32: out of time (KILN_BENCH_SECONDS=170)"],
 "failed": ["pytorch[compile+nhwc] (--precision tf32): error: RuntimeError: no Triton"]}
EOF
"$python" "$root/tools/gpu_report.py" "$dir" 3 || fail "tools/gpu_report.py exited non-zero (CUDA-graph steps)"
expect "**5.0 s of training to 99.0%** (reached after epoch 2"
expect "| fp32 | 128x128, 32 | 1100 | 1500 | 1480 | 1600 | 2000 | 0.94 | 0.75 | 912, 1 |"
expect "- not run: 224:128 tf32: out of time"
expect "- failed: pytorch[compile+nhwc] (--precision tf32): error: RuntimeError: no Triton"
expect "- resnet_graph_bf16: skipped (out of time"
expect "tools/gpu_check.sh $dir --only gemm_steps,resnet_graph_tf32,resnet_graph_bf16,resnet_graph_fp16,sanitize_initcheck_ops_cuda_test,synccheck --sanitize-timeout 480"
step resnet_graph_fp32 skipped - 0 "" "out of time (budget 540s): run again with --only and the same report directory"
"$python" "$root/tools/gpu_report.py" "$dir" 3 || fail "tools/gpu_report.py exited non-zero (CUDA-graph steps skipped)"
expect "tools/gpu_check.sh $dir --only gemm_steps,sanitize_initcheck_ops_cuda_test,resnet_graph,synccheck --sanitize-timeout 480"

# The GEMM ladder: gemm_steps at 2048 and 4096 (step 6 not built: skipped rows), gemm_steps_8192,
# and gemm_bench's ratios of steps 6 and 7; the targets at 4096^3 (step 5 met, step 7 not) and
# 8192^3 (step 7 met).
row() {  # row SIZE KERNEL DTYPE GFLOPS: a result of gemm_bench's JSON
  printf '{"size": %s, "kernel": "%s", "dtype": "%s", "ms": 1.0, "gflops": %s, "max_rel_error": 1e-7, "ok": true}\n' "$@"
}
skipped_row() {  # skipped_row SIZE KERNEL DTYPE WHY: a kernel gemm_bench could not run
  printf '{"size": %s, "kernel": "%s", "dtype": "%s", "skipped": "%s"}\n' "$@"
}
gemm_json() {  # gemm_json FILE < ROWS: gemm_bench's JSON with those results, one a line
  { echo '{"results": ['; paste -sd, -; echo '], "hand_over_vendor": []}'; } >"$1"
}
for n in 2048 4096; do
  row $n naive f32 5000; row $n tiled f32 6000; row $n regblock f32 42000
  row $n tc_bf16 bf16 137000; row $n tc_f16 f16 247000
  row $n sm90_bf16 bf16 420000; row $n sm90_f16 f16 430000
  skipped_row $n sm90ws_bf16 bf16 "gemm_sm90: step warp-specialized is not built yet"
  row $n sm90p_bf16 bf16 540000; row $n vendor f32 50000; row $n vendor_bf16 bf16 700000
done | gemm_json "$dir/gemm_steps.json"
{ row 8192 sm90_bf16 bf16 500000; row 8192 sm90p_bf16 bf16 600000; row 8192 vendor_bf16 bf16 720000; } |
  gemm_json "$dir/gemm_steps_8192.json"
cat >"$dir/gemm_bench.json" <<'EOF'
{"hand_over_vendor": [{"size": 4096, "sm90_bf16_over_vendor_bf16": 0.62},
                      {"size": 4096, "sm90ws_bf16_over_vendor_bf16": 0.71},
                      {"size": 4096, "sm90ws_bf16_over_sm90_bf16": 1.15},
                      {"size": 4096, "sm90p_bf16_over_vendor_bf16": 0.77},
                      {"size": 4096, "sm90p_bf16_over_sm90ws_bf16": 1.08}]}
EOF
"$python" "$root/tools/gpu_report.py" "$dir" 3 || fail "tools/gpu_report.py exited non-zero (GEMM ladder)"
expect "## GEMM ladder: steps 1-7 against cuBLAS"
expect "- step 5 (sm90_bf16) >= 0.55 x cublasGemmEx bf16 at 4096^3: 0.60, **met**"
expect "- step 7 (sm90p_bf16) >= 0.80 x cublasGemmEx bf16 at 4096^3: 0.77, **not met**"
expect "- step 7 (sm90p_bf16) >= 0.80 x cublasGemmEx bf16 at 8192^3: 0.83, **met**"
expect "N = 2048 (gemm_steps):"
expect "N = 8192 (gemm_steps_8192):"
expect "| 1 | naive (naive: one thread per element) | f32 | 5.0 | 0.01 | 0.10 |"
expect "| 5 | sm90_bf16 (Hopper: TMA, mbarriers, wgmma) | bf16 | 420.0 | 0.60 | - |"
expect "| 6 | sm90ws_bf16 (warp-specialised) | bf16 | skipped: gemm_sm90: step warp-specialized is not built yet | | |"
expect "| cuBLAS | vendor_bf16 (cublasGemmEx) | bf16 | 700.0 | 1.00 | - |"
expect "(step 6, warp-specialised, over cublasGemmEx, same bf16 inputs), N = 4096: 0.71 (over step 5: 1.15)."
expect "(step 7, persistent, over cublasGemmEx, same bf16 inputs), N = 4096: 0.77 (over step 6: 1.08)."
"$python" - "$dir/report.json" <<'EOF' || fail "report.json (GEMM ladder)"
import json, sys
r = json.load(open(sys.argv[1]))
assert [(t["step"], t["size"], t["status"]) for t in r["gemm_targets"]] == \
    [("5", 4096, "met"), ("7", 4096, "not met"), ("7", 8192, "met")], r["gemm_targets"]
assert sorted(r["gemm_ladder"]) == ["2048", "4096", "8192"], sorted(r["gemm_ladder"])
assert r["sm90p_bf16_over_sm90ws_bf16"] == {"4096": 1.08}, r["sm90p_bf16_over_sm90ws_bf16"]
EOF
# An older report (gemm_steps at 4096 only, without steps 6 and 7), then one from a GPU other
# than compute capability 9.0 (the Hopper rows skipped): the targets say why they were not
# measured. Last, no GEMM results at all.
rm -f "$dir/gemm_steps_8192.json" "$dir/gemm_bench.json"
{ row 4096 tc_bf16 bf16 137000; row 4096 sm90_bf16 bf16 300000; row 4096 vendor_bf16 bf16 700000; } |
  gemm_json "$dir/gemm_steps.json"
"$python" "$root/tools/gpu_report.py" "$dir" 3 || fail "tools/gpu_report.py exited non-zero (older GEMM report)"
expect "at 4096^3: 0.43, **not met**"
expect "- step 7 (sm90p_bf16) >= 0.80 x cublasGemmEx bf16 at 4096^3: **not measured** (no sm90p_bf16 row at 4096^3 in this report)"
expect "at 8192^3: **not measured** (no sm90p_bf16 row at 8192^3 in this report)"
why="cuda:0 is not compute capability 9.0 (TMA and wgmma are sm_90a features)"
{ row 4096 tc_bf16 bf16 137000; skipped_row 4096 sm90_bf16 bf16 "$why"; skipped_row 4096 sm90p_bf16 bf16 "$why"
  row 4096 vendor_bf16 bf16 700000; } | gemm_json "$dir/gemm_steps.json"
"$python" "$root/tools/gpu_report.py" "$dir" 3 || fail "tools/gpu_report.py exited non-zero (GEMM off 9.0)"
expect "at 4096^3: **not measured** (sm90_bf16 skipped: $why)"
expect "| 5 | sm90_bf16 (Hopper: TMA, mbarriers, wgmma) | bf16 | skipped: $why | | |"
expect "| 4 | tc_bf16 (tensor cores, WMMA) | bf16 | 137.0 | 0.20 | - |"
rm -f "$dir/gemm_steps.json"
"$python" "$root/tools/gpu_report.py" "$dir" 3 || fail "tools/gpu_report.py exited non-zero (no GEMM results)"
expect "Not run: no GEMM results in this report directory."

# ---- tools/gpu_check.sh: arguments, and no GPU ------------------------------------------------
check() {  # check EXIT_CODE TEXT ARGS...: gpu_check.sh ARGS exits EXIT_CODE saying TEXT on stderr
  local want_rc=$1 want_text=$2 err rc
  shift 2
  err=$(cd "$root" && timeout 20 tools/gpu_check.sh "$@" 2>&1 >/dev/null)
  rc=$?
  [[ $rc -eq $want_rc && $err == *"$want_text"* ]] ||
    fail "tools/gpu_check.sh $* -> exit $rc (want $want_rc), stderr lacks '$want_text': $err"
}
check 2 "--only: unknown stage 'sanitize_memcheck_nothing'" "$dir/r" --only sanitize_memcheck_nothing
check 2 "--only: unknown stage 'sanitize_racecheck_loader_cuda_test'" "$dir/r" --only sanitize_racecheck_loader_cuda_test
check 2 "--only needs a value" "$dir/r" --only ,
check 2 "--test-timeout needs seconds" "$dir/r" --test-timeout 0
check 2 "--sanitize-timeout needs seconds" "$dir/r" --sanitize-timeout x
check 2 "REPORT_DIR is missing" --only sanitize
check 2 "--only: unknown stage 'resnet_graph_fp64'" "$dir/r" --only resnet_graph_fp64
help=$(cd "$root" && tools/gpu_check.sh --help) || fail "--help did not exit 0"
for word in "--only STAGES" "sanitize_TOOL_PROGRAM" "--print-targets" "--sanitize-timeout" "custom_layer" "resnet_graph" "mnist_graph"; do
  [[ $help == *"$word"* ]] || fail "--help does not mention $word"
done
# Valid stages pass the checks; without an NVIDIA driver the check stops at once: exit 2, saying
# there is no GPU (with one, this part is not tested here).
if ! command -v nvidia-smi >/dev/null 2>&1; then
  start=$SECONDS
  check 2 "no GPU" "$dir/r" --only test,example,sanitize_memcheck_ops_cuda_test,racecheck,custom_layer
  ((SECONDS - start <= 5)) || fail "without a GPU, gpu_check.sh took $((SECONDS - start)) s to exit"
fi

if ((failed)); then
  echo "$failed checks failed; the report was:" >&2
  sed 's/^/    /' "$md" >&2
  exit 1
fi
echo "gpu_report_test: all checks passed"
