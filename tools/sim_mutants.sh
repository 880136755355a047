#!/usr/bin/env bash
# tools/sim_mutants.sh: plants one-line GPU bugs, one at a time, and runs the simulator's tests
# for each: the proof that the simulator catches what a GPU would. Prints a table: mutant,
# caught or missed, the first failing test.
#
#   tools/sim_mutants.sh [MUTANT_ID ...]        (default: every mutant; ids from --list)
#   tools/sim_mutants.sh --list
#
# The unmutated tree must pass first (else nothing could be judged). Each mutant is an exact
# replacement in one source file (the file is restored afterwards,
# also on Ctrl-C). The tests run in build-asan/ (the CUDA sources under the simulator, with
# AddressSanitizer, warps shuffled between barriers: tools/test.sh's strictest tree), built
# incrementally: one mutant costs a rebuild of what includes the file, then `ctest -L sim`.
# KILN_MUTANT_BUILD_DIR picks another simulator build tree. The source tree must have no
# uncommitted change to the mutated files. KILN_MUTANT_TESTS (a ctest -R regex) and
# KILN_MUTANT_TARGETS (build targets, space-separated; default kiln_tests_sim) narrow every run
# to the tests that should catch the chosen mutants: tools/test.sh does so for the mutants of
# the bugs a real GPU found, in minutes. Exit 1 when a mutant is missed or does not build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KILN_MUTANT_BUILD_DIR:-$root/build-asan}

/usr/bin/env python3 - "$root" "$build" "$@" <<'PY'
import os, re, subprocess, sys

root, build, args = sys.argv[1], sys.argv[2], sys.argv[3:]

# id, file, the exact text, which occurrence (1-based), its replacement, what it plants.
MUTANTS = [
    # Barriers: each __syncthreads() of the kernels that share memory between threads.
    ("gemm-tile-barrier", "engine/cuda/kernels/gemm.cu",
     "__syncthreads();  // the tiles are complete", 1, "",
     "tiled GEMM: the barrier after loading a tile removed"),
    ("gemm-reuse-barrier", "engine/cuda/kernels/gemm.cu",
     "__syncthreads();  // everyone is done with the tiles before they are overwritten", 1, "",
     "tiled GEMM: the barrier before overwriting the tiles removed"),
    ("gemm-prologue-barrier", "engine/cuda/kernels/gemm.cu", "__syncthreads();", 3, "",
     "register-blocked GEMM: the barrier after the first slice is stored removed"),
    ("gemm-slice-barrier", "engine/cuda/kernels/gemm.cu", "__syncthreads();", 4, "",
     "register-blocked GEMM: the barrier between two slices (double buffer) removed"),
    ("tc-prologue-barrier", "engine/cuda/kernels/gemm_tensor_core.cu",
     "__syncthreads();  // tensor-core prologue", 1, "//",
     "tensor-core GEMM: the barrier after the first slice is stored removed"),
    ("tc-slice-barrier", "engine/cuda/kernels/gemm_tensor_core.cu",
     "__syncthreads();  // tensor-core slice", 1, "//",
     "tensor-core GEMM: the barrier between two slices (double buffer) removed"),
    ("tc-staging-barrier", "engine/cuda/kernels/gemm_tensor_core.cu",
     "__syncwarp();  // tensor-core staging", 1, "//",
     "tensor-core GEMM: the warp barrier between storing an accumulator and copying it out removed"),
    # The Hopper GEMM's pipeline (gemm_sm90.cu): each ordering that keeps a TMA copy from
    # overwriting a stage a wgmma still reads, and the barriers' phases. (Its __syncthreads
    # before the refill is no such ordering: one thread's wgmma_wait_group completes the group
    # for the whole warpgroup, so removing it plants no bug; docs/cuda_simulator.md.)
    ("sm90-full-wait", "engine/cuda/kernels/gemm_sm90.cu",
     "sm90::mbarrier_wait(&s.full[st], static_cast<uint32_t>((slice / kSm90Stages) % 2));", 1,
     "", "Hopper GEMM: the wait for a stage's TMA copies (its full barrier) removed"),
    ("sm90-last-wait", "engine/cuda/kernels/gemm_sm90.cu",
     "sm90::wgmma_wait_group<0>();", 1, "",
     "Hopper GEMM: the wait for the last wgmma group before the epilogue removed"),
    ("sm90-refill-wait", "engine/cuda/kernels/gemm_sm90.cu",
     "sm90::wgmma_wait_group<1>();", 1, "",
     "Hopper GEMM: the wgmma wait before a stage is refilled removed"),
    ("sm90-phase-parity", "engine/cuda/kernels/gemm_sm90.cu",
     "static_cast<uint32_t>((slice / kSm90Stages) % 2)", 1, "0u",
     "Hopper GEMM: every wait on a stage's barrier with phase parity 0"),
    ("sm90-init-barrier", "engine/cuda/kernels/gemm_sm90.cu",
     "__syncthreads();  // sm90 init", 1, "//",
     "Hopper GEMM: the barrier after the mbarriers are initialised removed"),
    ("sm90-desc-swizzle", "engine/cuda/kernels/gemm_sm90_common.h",
     "sm90::make_smem_desc(rows + kk, kSwizzle,", 1,
     "sm90::make_smem_desc(rows + kk, sm90::Swizzle::B64,",
     "Hopper GEMM: wgmma descriptors say 64-byte swizzle where the TMA wrote 128-byte"),
    # Steps 6 and 7 (gemm_sm90_ws.cu): the producer's and the consumers' hand-offs.
    ("ws-full-wait", "engine/cuda/kernels/gemm_sm90_ws.cu",
     "sm90::mbarrier_wait(&s.full[st], static_cast<uint32_t>((it / kStages) % 2));", 1, "",
     "warp-specialised GEMM: the consumers' wait for a stage's TMA copies removed"),
    ("ws-empty-wait", "engine/cuda/kernels/gemm_sm90_ws.cu",
     "if (use > 0) sm90::mbarrier_wait(&s.empty[st], static_cast<uint32_t>((use - 1) % 2));",
     1, "", "warp-specialised GEMM: the producer's wait for a released stage removed"),
    ("ws-full-parity", "engine/cuda/kernels/gemm_sm90_ws.cu",
     "static_cast<uint32_t>((it / kStages) % 2)", 1, "0u",
     "warp-specialised GEMM: every wait on a full barrier with phase parity 0"),
    ("ws-empty-parity", "engine/cuda/kernels/gemm_sm90_ws.cu",
     "static_cast<uint32_t>((use - 1) % 2)", 1, "1u",
     "warp-specialised GEMM: every wait on an empty barrier with phase parity 1"),
    ("ws-release-wait", "engine/cuda/kernels/gemm_sm90_ws.cu",
     "sm90::wgmma_wait_group<1>();  // the previous slice's products are done", 1, "",
     "warp-specialised GEMM: a stage released without waiting for the wgmma reading it"),
    ("ws-release-current", "engine/cuda/kernels/gemm_sm90_ws.cu",
     "if (releaser && slice > 0) sm90::mbarrier_arrive(&s.empty[(it - 1) % kStages]);", 1,
     "if (releaser) sm90::mbarrier_arrive(&s.empty[it % kStages]);",
     "warp-specialised GEMM: the consumers release the stage whose products are still running"),
    ("ws-last-wait", "engine/cuda/kernels/gemm_sm90_ws.cu",
     "sm90::wgmma_wait_group<0>();  // the tile's last products are done", 1, "//",
     "warp-specialised GEMM: the wait for a tile's last wgmma group before its store removed"),
    ("ws-init-barrier", "engine/cuda/kernels/gemm_sm90_ws.cu",
     "__syncthreads();  // sm90 ws init", 1, "//",
     "warp-specialised GEMM: the barrier after the mbarriers are initialised removed"),
    ("transpose-barrier", "engine/cuda/kernels/transpose.cu", "__syncthreads();", 1, "",
     "transpose: the barrier between writing and reading the shared tile removed"),
    ("transpose-reuse-barrier", "engine/cuda/kernels/transpose.cu", "__syncthreads();", 2, "",
     "transpose: the barrier before the tile is reused by the next matrix removed"),
    ("reduce-barrier", "engine/cuda/kernels/reduce.cu", "__syncthreads();", 1, "",
     "sum_dim: the barrier before combining the partial sums removed"),
    ("reduce-reuse-barrier", "engine/cuda/kernels/reduce.cu", "__syncthreads();", 2, "",
     "sum_dim: the barrier before the partials are reused by the next row removed"),
    ("block-sum-entry-barrier", "engine/cuda/kernels/common.h",
     "__syncthreads();  // scratch may still be read by a previous call", 1, "",
     "block_sum: the barrier protecting the scratch of a previous call removed"),
    ("block-sum-barrier", "engine/cuda/kernels/common.h",
     "  if (lane == 0) scratch[warp] = v;\n  __syncthreads();", 1,
     "  if (lane == 0) scratch[warp] = v;",
     "block_sum: the barrier between writing and reading the warp partials removed"),
    ("block-max-entry-barrier", "engine/cuda/kernels/common.h",
     "  v = warp_max(v);\n  __syncthreads();", 1, "  v = warp_max(v);",
     "block_max: the barrier protecting the scratch of a previous call removed"),
    ("block-max-barrier", "engine/cuda/kernels/common.h",
     "  if (lane == 0) scratch[warp] = v;\n  __syncthreads();", 2,
     "  if (lane == 0) scratch[warp] = v;",
     "block_max: the barrier between writing and reading the warp partials removed"),
    ("block-min-barrier", "layers/loss_cuda.cu", "__syncthreads();", 1, "",
     "cross-entropy block_min: the barrier between writing and reading the partials removed"),
    # Not listed: block_min's closing barrier. Its one caller calls it last, with its own
    # scratch, so removing it changes nothing a GPU could show (an equivalent mutant).
    ("conv-prologue-barrier", "layers/conv2d_implicit_gemm.cuh", "__syncthreads();", 1, "",
     "implicit-GEMM convolution: the barrier after the first slice is stashed removed"),
    ("conv-barrier", "layers/conv2d_implicit_gemm.cuh", "__syncthreads();", 2, "",
     "implicit-GEMM convolution: the barrier of the main loop removed"),
    ("conv-bias-nhwc-barrier", "layers/conv2d_cuda.cu", "__syncthreads();", 1, "",
     "channels-last conv bias gradient: the barrier before adding the row groups' sums removed"),
    # Memory: past the end, unwritten.
    ("elementwise-past-end", "engine/cuda/kernels/elementwise.cu",
     "threadIdx.x; i < n; i += stride) {\n    const T bv", 1,
     "threadIdx.x; i <= n; i += stride) {\n    const T bv",
     "binary kernel: writes one element past the end (i <= n)"),
    ("elementwise-unwritten", "engine/cuda/kernels/elementwise.cu",
     "threadIdx.x; i < n; i += stride) {\n    const T bv", 1,
     "threadIdx.x; i + 1 < n; i += stride) {\n    const T bv",
     "binary kernel: leaves the last output element unwritten"),
    # Streams: each cross-stream wait and record_stream.
    ("event-wait", "engine/cuda/context.cpp",
     "if (event_) KILN_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));", 1, "",
     "Event::wait does nothing: no cross-stream wait anywhere (loader copy stream, copies)"),
    ("loader-compute-wait", "data/loader.cpp", "slot.copied.wait(compute);", 1, "",
     "loader: the compute stream does not wait for the batch's copy"),
    ("loader-record-stream", "data/loader.cpp",
     "cuda_allocator::record_stream(x.impl()->storage->data, compute);", 1, "",
     "loader: the batch is not recorded on the compute stream before its block is reused"),
    ("loader-slot-reuse", "data/loader.cpp",
     "slot.copied.synchronize();  // the previous batch's copy", 1,
     "// the previous batch's copy",
     "loader: a pinned slot is refilled without waiting for the copy still reading it"),
    ("loader-waits-for-device", "data/loader.cpp", "if (!writable(*free[i])) continue;", 1, "",
     "loader: next() takes the last freed slot and waits for its copy, which may wait for the "
     "compute stream"),
    # The simulator's model of CUDA's implicit synchronisations (what found the loader's wait).
    ("sim-malloc-fence", "engine/cuda/sim/memory.cpp",
     "  kiln::sim::implicit_synchronization(device);\n  return cudaSuccess;", 1,
     "  return cudaSuccess;",
     "simulator: cudaMalloc is no implicit synchronisation"),
    ("sim-host-fn-serial", "engine/cuda/sim/streams.cpp",
     "std::lock_guard<std::mutex> serial(kiln::sim::g_host_fn_mutex);", 1, "",
     "simulator: host functions of different streams run side by side"),
    ("peer-copy-source-wait", "engine/cuda/tensor_copy.cpp", "src_ready.wait(dst_stream);", 1, "",
     "peer copy: the copy does not wait for the work that writes its source"),
    ("peer-copy-release-wait", "engine/cuda/tensor_copy.cpp", "copied.wait(src_stream);", 1, "",
     "peer copy: the source stream may reuse the source before the copy has read it"),
    ("pinned-record-stream", "engine/cuda/tensor_copy.cpp",
     "pinned_allocator::record_stream(storage_base(host), stream);", 1, "",
     "async host copy: the pinned block is not kept until the copy has finished"),
    # Vendor libraries (the simulator's cuBLAS / cuDNN / NCCL check their arguments and order).
    ("cublas-ldc", "engine/cuda/kernels/gemm.cu", "ldc = s.n > 0 ? s.n : 1", 1,
     "ldc = s.m > 0 ? s.m : 1", "cuBLAS GEMM: the leading dimension of C is the wrong one"),
    ("cublas-lda", "engine/cuda/kernels/gemm.cu", "b, ldb, a, lda, &beta", 1,
     "b, lda, a, ldb, &beta", "cuBLAS GEMM: the leading dimensions of A and B swapped"),
    ("cudnn-workspace", "layers/conv2d_cudnn.cu", "ptr(ws), pass.workspace,", 1, "ptr(ws), 0,",
     "cuDNN forward convolution: the workspace size passed as 0"),
    ("nccl-caller-wait", "comm/communicator.cpp",
     "w->caller_ready_.wait(cuda::current_stream(device));", 1, "",
     "collectives: the communicator's stream does not wait for the submitter's kernels (NCCL)"),
    ("pipeline-receive-wait", "models/pipeline/pipeline.cpp",
     "message.ready->wait();", 1, "",
     "pipeline: a stage uses a received activation or gradient before its copy has finished"),
    ("pipeline-record-stream", "models/pipeline/pipeline.cpp",
     "cuda_allocator::record_stream(message.tensor.impl()->storage->data, cuda::current_stream());",
     1, "", "pipeline: a received tensor's block may be reused by the sender's stream while the "
     "receiving stage still reads it"),
    ("allocator-pending-query", "engine/cuda/caching_allocator.cpp",
     "const cudaError_t err = cudaEventQuery(e);", 1, "const cudaError_t err = cudaSuccess;",
     "caching allocator: a block used by another stream is reused before that stream is done"),
    # Floating point: the simulator compiles kernels without contracting multiply-adds, which
    # nvcc contracts (docs/cuda_simulator.md, "Floating point: contraction as nvcc does it").
    ("sim-fp-contract-off", "cmake/KilnCuda.cmake", "set(fp_options -ffp-contract=fast", 1,
     "set(fp_options -ffp-contract=off",
     "simulator: kernels compiled without FMA contraction (nvcc fuses a * b + c)"),
]

if args[:1] == ["--list"]:
    for m in MUTANTS:
        print(f"{m[0]:24s} {m[1]}: {m[5]}")
    sys.exit(0)
chosen = [m for m in MUTANTS if not args or m[0] in args]
unknown = set(args) - {m[0] for m in MUTANTS}
if unknown:
    sys.exit(f"sim_mutants.sh: unknown mutant(s) {', '.join(sorted(unknown))}: see --list")
if not os.path.isfile(os.path.join(build, "CMakeCache.txt")):
    sys.exit(f"sim_mutants.sh: {build} is not a build tree: configure it as tools/test.sh's "
             "asan tree does (-DKILN_CUDA_SIM=ON -DKILN_SANITIZE=address)")

def run(cmd, **kw):
    return subprocess.run(cmd, cwd=kw.pop("cwd", root), text=True, capture_output=True, **kw)

rows = []
# KILN_KERNELS=hand: the mutants are in our kernels, which the simulator's tests run by choice
# (the default, vendor, would run the simulated cuBLAS and cuDNN).
env = dict(os.environ, KILN_SIM_SHUFFLE="1", KILN_KERNELS="hand")
targets = os.environ.get("KILN_MUTANT_TARGETS", "kiln_tests_sim").split()
tests = os.environ.get("KILN_MUTANT_TESTS", "")
select = ["-L", "sim"] + (["-R", tests] if tests else [])
# A catch means something only if the unmutated tree passes: check that first.
b = run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target"] + targets)
if b.returncode != 0:
    sys.exit("sim_mutants.sh: the unmutated tree does not build:\n" + b.stdout[-3000:])
t = run(["ctest"] + select + ["-j", str(os.cpu_count() or 2), "--timeout", "300"], cwd=build,
        env=env)
if t.returncode != 0 or "No tests were found" in t.stdout + t.stderr:
    sys.exit("sim_mutants.sh: the unmutated tree already fails its sim tests, so no mutant could "
             "be judged; fix these first:\n" + "\n".join(l for l in t.stdout.splitlines()
                                                           if " - " in l and "(" in l))
print("sim_mutants.sh: the unmutated tree passes", file=sys.stderr, flush=True)
for mid, path, old, nth, new, what in chosen:
    full = os.path.join(root, path)
    src = open(full).read()
    at = -1
    for _ in range(nth):
        at = src.find(old, at + 1)
        if at < 0:
            sys.exit(f"sim_mutants.sh: {mid}: occurrence {nth} of its text is not in {path} "
                     "any more: update the mutant")
    try:
        open(full, "w").write(src[:at] + new + src[at + len(old):])
        b = run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target"] + targets)
        if b.returncode != 0:
            rows.append((mid, "build failed", what, ""))
            continue
        # A caught mutant needs one failing test: stop there (a missed one runs them all).
        t = run(["ctest"] + select + ["-j", str(os.cpu_count() or 2), "--timeout", "300",
                 "--stop-on-failure"], cwd=build, env=env)
        failed = re.findall(r"\d+ - (\S+) \((?:Failed|SEGFAULT|Subprocess aborted|Timeout|"
                            r"Exception|Child aborted)\)", t.stdout)
        rows.append((mid, "caught" if t.returncode != 0 else "MISSED", what,
                     ", ".join(failed[:3]) + (" ..." if len(failed) > 3 else "")))
    finally:
        open(full, "w").write(src)
    print(f"sim_mutants.sh: {mid}: {rows[-1][1]}", file=sys.stderr, flush=True)
# The tree is rebuilt from the restored sources, so it is left as it was found.
run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target"] + targets)

print("| mutant | planted bug | result | first failing tests |")
print("| --- | --- | --- | --- |")
for mid, result, what, tests in rows:
    print(f"| {mid} | {what} | {result} | {tests} |")
caught = sum(r[1] == "caught" for r in rows)
print(f"\n{caught} of {len(rows)} mutants caught")
sys.exit(0 if caught == len(rows) else 1)
PY
