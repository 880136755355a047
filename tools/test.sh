#!/usr/bin/env bash
# tools/test.sh: one command from a fresh machine to the full test suite: installs
# dependencies, runs the portability checks, fetches real MNIST (the e2e tests train on it), then
# builds and tests four trees and fuzzes for a few minutes:
#
#   lint         first, a few minutes, nothing built (docs/portability.md): every file includes
#                the standard header of each standard name it uses (tools/check_includes.py);
#                every header compiles alone with clang 16 and libc++ without its transitive
#                includes (tools/check_headers_alone.sh); the GPU bundle alone configures Kiln,
#                the machine's /usr hidden (tools/check_bundle_configure.sh); every repository
#                path that a comment or a doc names exists (tools/check_comment_refs.py).
#   build/       the default build (Release). Where nvcc is installed it includes the real CUDA
#                backend, compiled and linked for sm_90 even without a GPU, so nvcc errors never
#                land. Runs every test; CUDA tests (label gpu) skip, saying why, without a GPU.
#   build-sim/   the CUDA sources compiled as C++ against the CUDA simulator: ctest -L sim.
#                Then Kiln as a library: the tree is installed into a temporary prefix and
#                examples/custom_layer (its own CMake project: find_package(Kiln), a Swish
#                layer whose .cu file runs under the installed simulator) is configured
#                against it, built, and its whole ctest run.
#   build-asan/  EVERY test of the suite (CPU, comm, loader, MPI, apps, fuzz replays, and the
#                simulated CUDA kernels) under AddressSanitizer and UndefinedBehaviorSanitizer
#                (all of -fsanitize=undefined, alignment included; any report fails the test),
#                with the simulator in its shuffle mode (warps and lanes in a pseudo-random
#                order between barriers, KILN_SIM_SHUFFLE=1): a missing barrier, a write past a
#                buffer's end, a signed overflow or a misaligned float4 access fails here.
#   build-tsan/  ThreadSanitizer, with the simulator: every test that starts threads: the data
#                loader, comm/ (local transport, communicator worker thread, parameter server,
#                DataParallel, NCCL ranks), the pipeline's stage threads, the tests labelled
#                threads (the simulator's own tests, whose GPU threads are TSan fibers, so a
#                race between two threads of a block is a report; a whole mnist_train run with
#                two ranks and loader workers among them): ctest -L 'loader|comm|pipeline|threads'.
#                KILN_TSAN_ALL=1 adds every simulated kernel of the layers (label sim).
#   build-fuzz/  clang + libFuzzer (preset fuzz): every fuzz target of tests/fuzz for 30 s
#                (tools/fuzz.sh), from seed 1.
# Each tree is a configure preset of CMakePresets.json (release, sim, asan, tsan, fuzz).
#
# KILN_TEST_TREES=lint,default,sim,asan,tsan,fuzz picks stages (default: all six). Arguments go to
# every ctest call of the four test trees (e.g. -R Conv); the out-of-tree example runs all of its
# tests. KILN_FUZZ_SECONDS changes the fuzzing time per target, KILN_ASAN_ALL=1 adds the long
# training runs to the ASan tree, KILN_TSAN_ALL=1 the layers' simulated kernels to the TSan tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
trees=${KILN_TEST_TREES:-lint,default,sim,asan,tsan,fuzz}
jobs=$(nproc)
ctest_args=("$@")
has() { [[ ",$trees," == *",$1,"* ]]; }
if has lint; then "$root/tools/setup.sh" lint; else "$root/tools/setup.sh"; fi

# Portability, before anything is built: a file that compiles here only because this libstdc++
# happens to pull in a header it forgot fails on g++ 13 or libc++ (docs/portability.md).
if has lint; then
  echo "== test.sh: lint: standard headers included by name (tools/check_includes.py)"
  python3 "$root/tools/check_includes.py"
  echo "== test.sh: lint: every header compiles alone, clang 16 + libc++ without transitive includes (tools/check_headers_alone.sh)"
  "$root/tools/check_headers_alone.sh"
  echo "== test.sh: lint: the GPU bundle alone configures Kiln, /usr hidden (tools/check_bundle_configure.sh)"
  "$root/tools/check_bundle_configure.sh"
  # A comment that names a file which moved misleads its next reader: the paths, FILE.EXT:NAME
  # references and Markdown links of comments and docs must resolve (a second, no build needed).
  echo "== test.sh: lint: the files that comments and docs name exist (tools/check_comment_refs.py)"
  python3 "$root/tools/check_comment_refs.py" --quiet
fi
"$root/datasets/fetch_mnist.sh"

# run_tree <name> <build dir> <ctest label regex or ""> <build targets, space-separated> <preset>
# (the configure presets of CMakePresets.json; env KILN_TEST_EXCLUDE: a ctest -E regex of tests
# the tree leaves out)
run_tree() {
  local name=$1 dir=$2 label=$3 target=$4 preset=$5
  echo "== test.sh: $name tree in $dir (preset $preset), at ${SECONDS} s"
  cmake -S "$root" --preset "$preset" -B "$dir" >/dev/null
  # shellcheck disable=SC2086  # several targets, one word each
  cmake --build "$dir" -j "$jobs" --target $target
  # Label soak (tests/soak: the long runs, minutes) is never part of a tree's run: tools/soak.sh.
  local filter=(-LE soak)
  [[ -n "$label" ]] && filter+=(-L "$label")
  [[ -n "${KILN_TEST_EXCLUDE:-}" ]] && filter+=(-E "$KILN_TEST_EXCLUDE")
  # One test per core (CTEST_PARALLEL_LEVEL overrides): tests that start several processes or
  # ranks say so with their PROCESSORS property, and ctest keeps the sum within the cores.
  (cd "$dir" && ctest --output-on-failure --timeout 900 --parallel "${CTEST_PARALLEL_LEVEL:-$jobs}" \
                      "${filter[@]}" "${ctest_args[@]}")
}

# example_against_install <build dir>: installs that tree's libraries, headers and CMake package
# into a temporary prefix, then builds and tests examples/custom_layer against it, as a user
# of Kiln would (docs/using_kiln.md).
example_against_install() {
  local dir=$1
  echo "== test.sh: out-of-tree example against an installed Kiln (examples/custom_layer, Kiln from $dir)"
  local tmp
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-install.XXXXXX")
  cmake --build "$dir" -j "$jobs" --target kiln_engine kiln_layers kiln_data kiln_comm kiln_models kiln_pipeline
  cmake --install "$dir" --prefix "$tmp/prefix" >/dev/null
  cmake -S "$root/examples/custom_layer" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
  cmake --build "$tmp/build" -j "$jobs"
  (cd "$tmp/build" && ctest --output-on-failure --timeout 600)
  rm -rf "$tmp"
}

has default && run_tree default "${KILN_BUILD_DIR:-$root/build}" "" all release
# The simulator trees (sim, asan, tsan) ask for the hand kernels (KILN_KERNELS=hand, as the sim
# test preset does): the simulator is there to run our kernels, and its cuBLAS and cuDNN are
# host-computed stand-ins. The setting, not the build, picks the kernels (engine/impl.h), so a
# test runs the same code here as on a GPU with the same KILN_KERNELS; tests that mean vendor
# ask for it (a KernelsGuard, or KILN_KERNELS=vendor on the test: resnet_cuda_test_vendor).
has sim && KILN_KERNELS=hand run_tree simulator "$root/build-sim" sim kiln_tests_sim sim
has sim && example_against_install "$root/build-sim"
# The bugs a real GPU found that the simulator once missed stay found: each is planted again in
# the simulator tree (tools/sim_mutants.sh: the loader waiting for the compute stream through
# a slot's copy, a slot refilled under its copy, and the simulator's own model of cudaMalloc's
# implicit synchronisation and of serialised host functions) and must fail the loader's and the
# streams' tests. A few minutes: one file rebuilt, two test programs relinked, per mutant.
has sim && { echo "== test.sh: simulator: planted GPU bugs must fail the tests (tools/sim_mutants.sh)";
             KILN_MUTANT_BUILD_DIR="$root/build-sim" KILN_MUTANT_TARGETS="loader_cuda_test sim_streams_test" \
             KILN_MUTANT_TESTS='^(LoaderCuda|SimStreams)\.' \
             "$root/tools/sim_mutants.sh" loader-waits-for-device loader-slot-reuse sim-malloc-fence sim-host-fn-serial; }
# ASan + UBSan at -O1 with frame pointers, the whole suite. LeakSanitizer is on; Open MPI's
# libraries keep allocations to their exit (tools/lsan.supp), and what its unloaded components
# kept cannot be told apart, so the mpi tests run without leak checks (tests/CMakeLists.txt).
# OMP_NUM_THREADS=1 and one test per core (as in every tree): ASan's overhead falls on each test
# alone.
# Left out: whole training runs, which take 30 s to 6 minutes each here (mnist_train's e2e
# training tests, 20 minutes of this tree on 2 cores; whole ResNets; the kill-and-resume
# scripts; whole training steps under the simulator: the sync-debug, CUDA-graph and 16-bit
# activation steps, the programs run under sync-debug, the delayed pipeline; mnist_train's
# ResNet runs and the minimal training example: 9 test-minutes more):
# the code they run is the code of the layer, loader, comm and checkpoint tests that do run
# here, and the short whole-program runs stay (flags, checkpoints, rank death, the two-rank
# threads smoke test). KILN_ASAN_ALL=1 runs them too.
asan_long='^MnistTrainTest\.|^ResNetDepths\.|^ResNetNames\.|^ResNetConditioning\.|^ResNetCuda\.|^resnet_cuda_test_vendor$|^resnet_bench_sim_smoke$|^kill_resume_'
asan_long+='|^TrainStepSyncCuda\.|^TrainStepGraphCuda\.|^StepGraphCuda\.|^SyncDebugE2e\.|^AutocastActivationsCuda\.'
asan_long+='|^MnistTrainResNetTest\.|^train_mnist_minimal_e2e$|^pipeline_cuda_test_delayed$|^resnet_bench_sim_16bit_activations_smoke$'
[[ -n "${KILN_ASAN_ALL:-}" ]] && asan_long='^$'
has asan && KILN_TEST_EXCLUDE="$asan_long" KILN_SIM_SHUFFLE=1 OMP_NUM_THREADS=1 KILN_KERNELS=hand \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS="suppressions=$root/tools/lsan.supp" \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_tree "everything + AddressSanitizer + UBSan, simulator shuffled" "$root/build-asan" "" all asan
# TSan: the loader's workers, queue and shutdown paths, comm/'s threads, and the simulator (its
# block thread pool, and races between GPU threads: docs/cuda_simulator.md). Any report fails
# the test (TSan's exit code 66). OMP_NUM_THREADS=1 and KILN_KERNELS=hand: libgomp and oneDNN
# are not built with TSan, so their thread pool and primitive cache would be reported as races
# in code that has none. The pipeline tests (stage threads, queues, hybrid, the pipeline over
# two simulated GPUs) run here too. Left out: the layers' simulated kernels (label sim alone),
# 2,470 of the tree's 2,900 test-seconds (25 minutes on 2 cores), as TSan follows the memory
# accesses of every simulated GPU thread's fiber. Their barriers are checked by the ASan tree,
# which runs every kernel with warps and lanes shuffled between barriers, so a missing
# __syncthreads() gives a wrong result there; the simulator's own tests here show that TSan
# sees a race between GPU threads (sim_race_detection_*). KILN_TSAN_ALL=1 runs them, but for whole models and whole
# programs under the simulator (ResNetCuda: ~8 min; AutocastActivationsCuda: 4 min each; the
# mnist_train and resnet_bench runs), whose threads are the loader's, comm/'s and the pipeline's,
# whose own tests run here, with one whole two-rank mnist_train run (label threads). The parity
# table runs as eight processes, without its autocast rows (tests/parity/CMakeLists.txt).
tsan_labels='loader|comm|pipeline|threads'
tsan_targets="kiln_tests_loader kiln_tests_comm kiln_tests_pipeline kiln_tests_threads"
if [[ -n "${KILN_TSAN_ALL:-}" ]]; then
  tsan_labels='loader|comm|sim|pipeline|threads'
  tsan_targets+=" kiln_tests_sim"
fi
has tsan && KILN_TEST_EXCLUDE='^ResNetCuda\.|^AutocastActivationsCuda\.|^resnet_bench_sim_smoke$|^resnet_bench_sim_16bit_activations_smoke$|^MnistTrainTest\.|^mnist_train_rank_death_nccl$|^resnet_cuda_test_vendor$' OMP_NUM_THREADS=1 KILN_KERNELS=hand run_tree "ThreadSanitizer (threads: loader, comm, pipeline, apps, the simulator)" \
  "$root/build-tsan" "$tsan_labels" "$tsan_targets" tsan
# Fuzzing: every libFuzzer target of tests/fuzz for 30 s (clang and libFuzzer from
# tools/setup.sh fuzz; the fuzz preset's tree, build-fuzz/), from the committed corpora, seed 1
# (which does not make two runs alike: tools/fuzz.sh says why). A finding fails the run and is
# saved under build-fuzz/fuzz-artifacts/. The corpora themselves are replayed as ordinary tests
# in every tree above (label fuzz): that part is deterministic.
has fuzz && { echo "== test.sh: fuzzing (tools/fuzz.sh all ${KILN_FUZZ_SECONDS:-30})";
              KILN_FUZZ_SEED=${KILN_FUZZ_SEED:-1} "$root/tools/fuzz.sh" all "${KILN_FUZZ_SECONDS:-30}"; }
echo "== test.sh: all selected trees passed ($trees) in ${SECONDS} s"
