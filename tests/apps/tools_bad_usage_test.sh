#!/usr/bin/env bash
# tools_bad_usage_test.sh: the shell tools in tools/ refuse bad arguments before any work: a
# usage line on stderr and exit 2 (and -h/--help exits 0). One row per case:
#   <expected exit code> | <expected text in stderr> | <script> [args...]
# Usage: tests/apps/tools_bad_usage_test.sh SOURCE_DIR
set -uo pipefail
root=${1:?usage: tools_bad_usage_test.sh SOURCE_DIR}
failed=0 count=0
check() {
  local want_rc=$1 want_text=$2
  shift 2
  local err rc
  # The scripts that build or run find no build tree here (KILN_BUILD_DIR): a bad row must stop
  # before they would look for one.
  err=$(cd "$root" && KILN_BUILD_DIR=/nonexistent-kiln-build timeout 20 "$@" 2>&1 >/dev/null)
  rc=$?
  count=$((count + 1))
  if [[ $rc -ne $want_rc || $err != *"$want_text"* ]]; then
    echo "FAIL: $* -> exit $rc (want $want_rc), stderr lacks or differs from '$want_text':" >&2
    echo "$err" | sed 's/^/    /' >&2
    failed=$((failed + 1))
  fi
}
for s in dp comm loader model_parallel recipe; do
  check 2 "unexpected argument '--epochs': it takes none" tools/${s}_experiment.sh --epochs 3
  check 2 "usage: [VAR=value ...] tools/${s}_experiment.sh" tools/${s}_experiment.sh foo
  check 0 "" tools/${s}_experiment.sh --help
done
check 2 "rounds must be a whole number >= 1 (got 0)" tools/bench_vs_pytorch.sh 0
check 2 "kernels must be one of hand, vendor (got fast)" tools/bench_vs_pytorch.sh 3 fast
check 2 "precision must be one of fp32, bf16, fp16 (got fp64)" tools/bench_vs_pytorch.sh 3 vendor fp64
check 2 "at most 3 arguments" tools/bench_vs_pytorch.sh 3 vendor fp32 extra
check 2 "usage: tools/bench_vs_pytorch.sh" tools/bench_vs_pytorch.sh x
check 2 "threads must be a whole number >= 1 (got -2)" tools/bench_resnet_vs_pytorch.sh 3 -2
check 2 "device must be cpu, cuda or cuda:N (got tpu)" tools/bench_resnet_vs_pytorch.sh 3 2 tpu
check 2 "precision must be one of fp32, bf16, fp16 (got tf32)" tools/bench_resnet_vs_pytorch.sh 3 2 cpu tf32
check 2 "usage: tools/bench_resnet_vs_pytorch.sh" tools/bench_resnet_vs_pytorch.sh 1 2 cpu fp32 more
check 2 "at most 5 arguments" tools/bench_resnet_vs_pytorch.sh 1 2 cpu fp32 128:32 more
check 2 "workload must be IMAGE:BATCH, e.g. 128:32 (got 128:32,224:128)" tools/bench_resnet_vs_pytorch.sh 1 2 cpu fp32 128:32,224:128
check 2 "precision must be fp32, tf32, bf16, fp16, a comma-separated list of them, or all (got fp64)" tools/bench_resnet_vs_pytorch.sh 1 1 cuda fp64
check 2 "workload must be IMAGE:BATCH or a comma-separated list of them" tools/bench_resnet_vs_pytorch.sh 1 1 cuda all 224x128
check 2 "KILN_BENCH_RUNNERS must be a comma-separated list" env KILN_BENCH_RUNNERS=kiln,tf tools/bench_resnet_vs_pytorch.sh 1 1 cuda:0
check 2 "usage: tools/gpu_bundle.sh [make|unpack|packages|not-carried]" tools/gpu_bundle.sh bogus
check 2 "check_includes.py: unknown option --bogus" tools/check_includes.py --bogus
check 2 "check_headers_alone.sh: --bogus: not a header" tools/check_headers_alone.sh --bogus
check 2 "check_bundle_configure.sh: takes no arguments" tools/check_bundle_configure.sh --bogus
check 2 "unknown option --bogus" tools/gpu_check.sh --bogus
check 2 "--epochs needs a positive number" tools/gpu_check.sh out --epochs 0
check 2 "usage: tools/gpu_check.sh" tools/gpu_check.sh out --only nothing
check 2 "KILLS must be a number, got 'many'" tools/kill_resume.sh many
check 2 "unknown argument '--bogus'" tools/rank_death.sh --bogus
check 2 "--dead-rank must be 0, 1 or 2" tools/rank_death.sh --dead-rank 5
check 2 "unknown argument '--fast'" tools/reliability.sh --fast
check 0 "" tools/reliability.sh --help
echo "$((count - failed)) of $count tool invocations as expected"
[[ $failed -eq 0 ]]
