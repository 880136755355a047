// mnist_train: trains a CNN (or an MLP) on MNIST end to end and reports what it measured.
//
//   mnist_train                       the MNIST CNN, Adadelta lr 1.0 with StepLR gamma 0.7 per
//                                     epoch, batch 128 (the PyTorch MNIST example recipe): >= 99%
//   mnist_train --model mlp --optimizer sgd --epochs 3 --json out.json
//   mnist_train --recipe fast         Adam with a one-cycle learning rate, fewer epochs: >= 99%
//   mnist_train --lr-schedule cyclic --optimizer sgd --lr 0.05     (apps/mnist/schedule.h)
//   mnist_train --checkpoint run.ckpt --epochs 2 ; mnist_train --resume run.ckpt --epochs 4
//   mnist_train --checkpoint run.ckpt --checkpoint-every 50   (killed? --resume run.ckpt goes on
//                                     from the step of the newest checkpoint: tools/kill_resume.sh)
//   mnist_train --format imagefolder --data DIR --workers 2   (DIR/train/<class>/*.png, DIR/test)
//   mnist_train --dist local:2                       2 data-parallel ranks as threads
//   mpirun -np 2 mnist_train --dist mpi --allreduce ring      2 processes (any hosts)
//   mnist_train --dist nccl:2 --allreduce native     2 ranks as threads on cuda:0 and cuda:1
//   mpirun -np 2 mnist_train --dist nccl             2 processes, one GPU each
//   mnist_train --dist local:3 --allreduce ps --ps-servers 1 --ps-async   async parameter server
//   mnist_train --trace run.json      a timeline of the run (tools/plot.py --trace run.json)
//   mnist_train --device cuda --data-on-device --cuda-graph   the data set in GPU memory, each
//                                     step one CUDA graph replay: the same results, faster
//
// Data parallelism (--dist; comm/data_parallel.h): every rank holds a replica of the model and
// trains on its shard of the data (DistributedSampler: the same epoch order on every rank, rank
// r takes every N-th example). --batch-size is the GLOBAL batch, split evenly over the worker
// ranks, and gradients are averaged over them, so N ranks compute what one rank computes with
// the same flags (the same >= 99%), only faster. --batch-per-rank is Horovod's recipe instead:
// --batch-size per rank, the learning rate multiplied by the number of workers, reached by a
// linear warm-up over --warmup-epochs (Goyal et al. 2017). Each worker evaluates its slice of the
// test set and the counts are summed; rank 0 alone prints, writes the JSON and the checkpoints;
// at the end every rank compares its weights with rank 0's, bit for bit, and says so. An error
// on one rank stops all of them (local: run_local; mpi: abort). Ranks started with different
// flags, models or data sizes stop before any work, every one with exit 2, rank 0 naming what
// differs (comm/agreement.h); several processes under mpirun or srun without --dist are refused
// the same way (apps/common/launcher.h).
//
// What a run does, in order: parse flags (CLI11), choose the device and the thread budget,
// seed the Philox generator (initialisation and dropout draw from it), load MNIST, then per
// epoch: train over a seeded random permutation (RandomSampler: a pure function of
// (seed, epoch)) fed by the asynchronous Loader (data/loader.h: --workers threads build the
// next batches while the model trains; the batches are the same bits for any worker count),
// evaluate on the test set in eval mode under NoGradGuard, print one line, and save a
// checkpoint (with --checkpoint-every N, also every N optimizer steps inside the epoch). At
// the end, an optional JSON summary.
//
// Resuming reproduces an uninterrupted run bit for bit (for the same flags, thread count and
// rank count), from an epoch end or from the middle of an epoch: the checkpoint holds the
// model, optimizer and loss-scaler state, the generator's (seed, offset), the epoch's position
// (examples of its global order consumed), the optimizer step count and the epoch's running
// loss sums; the sampler is re-derived from (seed, epoch) and started at the position, and the
// learning-rate schedules are pure functions of the epoch or of the step count
// (apps/common/train_checkpoint.h). A checkpoint written with N ranks resumes with M: the
// epoch's remaining examples are dealt out among the M ranks (data/sampler.h).
//
// Where the pieces are (apps/mnist/, namespace kiln::apps::mnist; this file keeps the flow:
// run(), and train_rank(), the story of one rank):
//   options.h        the flags' values, and the measurements behind the defaults
//   flags.h          every flag (CLI11) with its range, and the checks before any work
//   device.h         --device and --kernels: which device, which kernels, simulated or not;
//                    what --data-on-device and --cuda-graph need of it
//   datasets.h       MNIST in --format idx or imagefolder, --limit-*
//   model_state.h    model + optimizer from the seed or --resume; --checkpoint after each epoch
//   train_loop.h     one training epoch, one evaluation pass (EpochResult, StepFn)
//   schedule.h       --lr-schedule (step, cosine, onecycle, cyclic) and --recipe
//   dist_flags.h     --dist and the data-parallel flags: parsing and usage checks
//   rank_settings.h  what the ranks must share (flags, model, set sizes), compared at start
//   dist_training.h  one rank's data parallelism: layout, server ranks, the synchronous or
//                    asynchronous step, sums over the workers, the end-of-run replica check
//   run_report.h     the printed lines and the JSON summary
//
// Exit codes (docs/architecture.md): 0 ok; 2 bad usage or bad input (flags, data, checkpoint);
// 1 a runtime failure. Every error message says what to do.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/flag_checks.h"
#include "apps/common/launcher.h"
#include "apps/common/mixed_precision.h"
#include "apps/common/step_flops.h"
#include "apps/common/progress.h"
#include "apps/common/rank_agreement.h"
#include "apps/common/train_checkpoint.h"
#include "apps/mnist/datasets.h"
#include "apps/mnist/device.h"
#include "apps/mnist/dist_flags.h"
#include "apps/mnist/dist_training.h"
#include "apps/mnist/flags.h"
#include "apps/mnist/model_state.h"
#include "apps/mnist/options.h"
#include "apps/mnist/rank_settings.h"
#include "apps/mnist/run_report.h"
#include "apps/mnist/schedule.h"
#include "apps/mnist/train_loop.h"
#include "comm/data_parallel.h"
#include "comm/local_transport.h"
#if KILN_WITH_NCCL
#include "comm/nccl_transport.h"
#endif
#include "data/device_mnist.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "engine/error.h"
#include "engine/impl.h"
#include "engine/optim/lr_schedule.h"
#include "engine/parallel.h"
#include "engine/philox.h"
#include "engine/step_graph.h"
#include "engine/trace.h"

using namespace kiln;
using namespace kiln::apps::mnist;
using apps::Clock;
using apps::seconds_since;

namespace {

// ---- One rank ------------------------------------------------------------------------------

// The batch sizes: --batch-size is the global batch, split over the workers, unless
// --batch-per-rank makes it each worker's.
RunPlan plan_run(const Options& o, Device device, const RankLayout& ranks, int start_epoch) {
  RunPlan plan;
  plan.device = device;
  plan.ranks = ranks;
  plan.start_epoch = start_epoch;
  plan.rank_batch = !ranks.dist || o.batch_per_rank ? o.batch_size : o.batch_size / ranks.workers;
  plan.global_batch = o.batch_per_rank ? o.batch_size * ranks.workers : o.batch_size;
  return plan;
}

// What a rank reads: its shard of each training epoch, and its slice of the test set.
struct RankLoaders {
  std::unique_ptr<BatchSource> train, test;
  std::shared_ptr<ShardSampler> test_shard;
};

RankLoaders make_loaders(const Options& o, const Datasets& data, const RunPlan& plan) {
  const int rank = plan.ranks.rank, workers = plan.ranks.workers;
  if (o.data_on_device) {
    // Both sets on the GPU, batches gathered there in the order the loaders would give
    // (check_device_flags: one rank, --format idx).
    RankLoaders l;
    l.train = std::make_unique<DeviceMnistBatches>(
        *data.idx_train, std::make_shared<RandomSampler>(data.train->size(), o.seed),
        plan.rank_batch, plan.device);
    l.test_shard = std::make_shared<ShardSampler>(data.test->size(), rank, workers);
    l.test = std::make_unique<DeviceMnistBatches>(*data.idx_test, l.test_shard,
                                                  o.eval_batch_size, plan.device);
    return l;
  }
  // The loaders deliver batches on the training device (a GPU: pinned slots, copy stream).
  LoaderOptions lo;
  lo.workers = o.workers;
  lo.prefetch = o.prefetch;
  lo.pin_memory = o.pin_memory;
  lo.device = plan.device;
  lo.transform = data.transform;
  lo.seed = o.seed;
  LoaderOptions train_options = lo, test_options = lo;
  train_options.batch_size = plan.rank_batch;
  test_options.batch_size = o.eval_batch_size;
  std::shared_ptr<Sampler> sampler;
  if (plan.ranks.dist) {
    sampler = std::make_shared<DistributedSampler>(data.train->size(), rank, workers,
                                                   /*shuffle=*/true, o.seed);
  } else {
    sampler = std::make_shared<RandomSampler>(data.train->size(), o.seed);
  }
  RankLoaders l;
  l.train = std::make_unique<Loader>(*data.train, sampler, train_options);
  // Evaluation is sharded too: each worker scores its contiguous slice of the test set and the
  // counts are summed, so no rank idles while another evaluates (an idle rank would wait for it
  // in its first allreduce of the next epoch, and that wait showed up as exposed communication).
  l.test_shard = std::make_shared<ShardSampler>(data.test->size(), rank, workers);
  l.test = std::make_unique<Loader>(*data.test, l.test_shard, test_options);
  return l;
}

// Learning rate: --lr-schedule (StepLR per epoch by default; apps/mnist/schedule.h); with
// --batch-per-rank, the large-minibatch recipe per step (x workers after plan.warmup_steps of
// linear warm-up, then gamma per epoch).
std::shared_ptr<LRSchedule> make_lr_schedule(const Options& o, const RunPlan& plan,
                                             int64_t steps_per_epoch) {
  if (o.batch_per_rank) {
    return comm::large_minibatch_schedule(o.lr, plan.ranks.workers, plan.warmup_steps,
                                          steps_per_epoch, o.gamma);
  }
  return make_schedule(o, steps_per_epoch, static_cast<int64_t>(o.epochs) * steps_per_epoch);
}

// --warmup-epochs in optimizer steps (1 epoch when not given).
int64_t warmup_steps(const Options& o, int64_t steps_per_epoch) {
  const double warmup_epochs = o.warmup_epochs < 0 ? 1.0 : o.warmup_epochs;
  return static_cast<int64_t>(std::llround(warmup_epochs * steps_per_epoch));
}

// Rank 0, after training: the JSON summary, the closing lines, and the exit code.
int report_on_rank0(const Options& o, const RunPlan& plan, const Datasets& data,
                    const std::vector<EpochResult>& results,
                    const std::vector<apps::EpochRecord>& history, const DistTraining* dist,
                    bool replicas_equal, const GradScaler* scaler, int64_t graph_replays) {
  const CommSummary traffic = dist != nullptr ? dist->comm_summary() : CommSummary();
  if (!o.json.empty()) {
    write_json(o.json, summary_json(o, plan, data, results, history, traffic, replicas_equal,
                                    scaler, graph_replays));
  }
  if (!o.quiet) print_closing_lines(o, plan, results, traffic);
  if (!replicas_equal) {
    std::fprintf(stderr, "mnist_train: error: the replicas diverged: some rank's weights differ "
                 "from rank 0's after training (see the lines above); this is a bug in the "
                 "data-parallel code\n");
    return 1;
  }
  return 0;
}

// Trains as rank t->rank() of the group (t null: --dist none, the plain single-process run).
// Returns the exit code.
int train_rank(Options o, const CLI::App& app, Device device, const apps::TrainCheckpoint& resumed,
               const std::shared_ptr<comm::Transport>& t) {
  const RankLayout ranks = rank_layout(o, t.get());
  // A trace's rows: "rank R", and the threads this one starts extend it ("rank R loader worker
  // 0", "rank R allreduce").
  trace::set_thread_label("rank " + std::to_string(ranks.rank));
  if (ranks.dist) {
    if (t->device().is_cuda()) device = t->device();  // nccl: this rank's GPU
    share_host_between_ranks(o, app, *t);
  }
  set_num_threads(o.threads);
  if (ranks.is_server()) {  // a dedicated parameter-server rank: no model, no data
    serve_parameters(o, ranks, *t);
    return 0;
  }

  // Each local rank draws from its own generator (a thread of this process).
  Generator rank_generator(o.seed);
  std::optional<GeneratorScope> generator_scope;
  if (ranks.dist) generator_scope.emplace(rank_generator);
  ModelState state = build_model_state(o, device, resumed);
  const Datasets data = load_datasets(o);
  if (!o.resume.empty()) apps::check_checkpoint_fits_dataset(resumed, o.resume, data.train->size());
  std::unique_ptr<DistTraining> dist;  // null for --dist none
  if (ranks.dist) {
    // The same model and data sizes on every worker, before any parameter travels.
    if (const int rc = apps::refuse_unless_ranks_agree(
            "mnist_train", *t, worker_settings(*state.model, *data.train, *data.test),
            ranks.workers)) {
      return rc;
    }
    use_rank_dropout_stream(o.seed, ranks.rank);
    dist = std::make_unique<DistTraining>(o, t, ranks, *state.model);  // equal replicas from here
  }

  RunPlan plan = plan_run(o, device, ranks, state.start_epoch);
  plan.start_position = state.start_progress.position;
  const RankLoaders loaders = make_loaders(o, data, plan);
  const int64_t steps_per_epoch = std::max<int64_t>(1, loaders.train->num_batches());
  plan.warmup_steps = warmup_steps(o, steps_per_epoch);
  const std::shared_ptr<LRSchedule> schedule = make_lr_schedule(o, plan, steps_per_epoch);
  const bool print = !o.quiet && ranks.rank == 0;
  if (print) print_run_header(o, plan, *state.model, data);

  // The training step: --batch-per-rank and the per-step schedules (cosine, onecycle, cyclic)
  // set the learning rate before each step, then backward and the update, alone or with the
  // other ranks, or the whole step as a CUDA graph (--cuda-graph).
  const Precision precision = apps::setup_precision(o.precision, device);
  // --activations: 16-bit between the layers by default for resnet18 (check_model_flags has
  // refused 16bit for the others).
  const AutocastPolicy autocast{autocast_dtype_of(precision),
                                apps::parse_activations(activations_of(o))};
  // The model FLOPs of training on one image (apps/common/step_flops.h), for the epoch line.
  const apps::StepFlops image_flops =
      print ? apps::step_flops(*state.model, {1, 1, 28, 28}, true, device, precision) : apps::StepFlops{};
  const bool per_step = o.batch_per_rank || schedule_per_step(o);
  // Optimizer steps so far: a checkpoint says; an epoch-end file of an older Kiln does not, and
  // its epochs were whole.
  int64_t global_step = state.start_step >= 0
                            ? state.start_step
                            : static_cast<int64_t>(plan.start_epoch) * steps_per_epoch;
  // --cuda-graph: the whole step through a StepGraph (its warm-up steps eager, then one capture
  // and a replay per step), reading the batch from static inputs (train_loop.h, TrainStep).
  std::unique_ptr<StepGraph> graph;
  TrainStep step;
  if (o.cuda_graph) {
    graph = std::make_unique<StepGraph>(device);
    step.graph = graph.get();
    Shape batch{plan.rank_batch};
    const Shape example = data.train->example_shape();
    batch.insert(batch.end(), example.begin(), example.end());
    step.inputs = Tensor::empty(batch, DType::F32, device);
    step.labels = Tensor::empty({plan.rank_batch}, DType::I64, device);
    // fp16: the loss scale and the skip decision stay on the device (a replay decides nothing
    // on the host).
    if (state.scaler) state.scaler->keep_on_device(device);
  }
  // On the host before each step, outside any graph.
  step.before = [&] {
    if (per_step) schedule->apply(*state.opt, global_step);
    ++global_step;
  };
  step.update = [&](Tensor& loss, const trace::Ids& ids) {
    GradScaler* scaler = state.scaler.get();  // fp16 only
    if (dist) {
      dist->step(loss, *state.opt, ids, scaler);
      return;
    }
    state.opt->zero_grad();
    if (graph) {
      // Nothing here may wait for the device or record a timing event: the step is captured.
      if (scaler) {
        scaler->scale(loss).backward();
        scaler->unscale_on_device(state.model->parameters());
        state.opt->step(scaler->found_inf());  // skipped on the device when a gradient overflowed
        scaler->update_on_device();
      } else {
        loss.backward();
        state.opt->step();
      }
      return;
    }
    {
      trace::Scope backward("backward", trace::Phase::Backward, device, ids);
      if (scaler) scaler->scale(loss).backward();
      else loss.backward();
    }
    trace::Scope update("optimizer", trace::Phase::Optimizer, device, ids);
    // fp16: the step runs unless a gradient overflowed (then the scale halves instead).
    if (scaler && !scaler->update(scaler->unscale_(state.model->parameters()))) return;
    state.opt->step();
  };

  // Checkpoints: rank 0 writes them (the replicas are equal); mid-epoch ones every
  // --checkpoint-every optimizer steps, with the epoch's sums over all workers.
  double last_accuracy = resumed.test_accuracy;
  // The run's finished epochs: the resumed checkpoint's, then this process's (for the
  // checkpoints and the JSON summary's history).
  std::vector<apps::EpochRecord> history;
  for (const apps::EpochRecord& e : resumed.history) {
    if (e.epoch < plan.start_epoch) history.push_back(e);
  }
  int current_epoch = plan.start_epoch;
  MidEpochSave mid_epoch;
  mid_epoch.due = [&] { return global_step % o.checkpoint_every == 0; };
  mid_epoch.save = [&](const EpochProgress& mine) {
    SavePoint at;
    at.train_examples = data.train->size();
    at.epoch = current_epoch;
    at.progress = mine;
    if (dist) dist->sum_progress_over_workers(at.progress);
    at.global_step = global_step;
    at.workers = ranks.workers;
    at.test_accuracy = last_accuracy;
    at.history = history;
    if (ranks.rank == 0) save_checkpoint(o, at, state);
  };
  const bool mid_epoch_checkpoints = !o.checkpoint.empty() && o.checkpoint_every > 0;

  std::vector<EpochResult> results;
  for (int epoch = plan.start_epoch; epoch < o.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    current_epoch = epoch;
    if (!per_step) schedule->apply(*state.opt, epoch);
    EpochResult r;
    // A checkpoint written mid-epoch resumes that epoch where it stood. Its sums are all the
    // workers' together: rank 0 carries them, so the sums over the workers add up.
    EpochProgress start = epoch == plan.start_epoch ? state.start_progress : EpochProgress{};
    if (ranks.rank != 0) start.loss_sum = 0, start.seen = 0;
    train_epoch(*state.model, step, *loaders.train, device, epoch, o.epochs, print,
                ranks.dist ? ranks.rank : -1, r, autocast, start,
                mid_epoch_checkpoints ? &mid_epoch : nullptr);
    if (dist) dist->sum_training_over_workers(r);
    evaluate(*state.model, *loaders.test, device, r, autocast);
    if (dist) dist->sum_evaluation_over_workers(r, loaders.test_shard->size());
    results.push_back(r);
    if (state.scaler && print) {
      std::printf("loss scale %g, %lld of %lld steps skipped\n", state.scaler->scale_value(),
                  static_cast<long long>(state.scaler->skipped_steps()),
                  static_cast<long long>(state.scaler->steps()));
    }
    last_accuracy = r.test_accuracy;
    history.push_back(
        {epoch, r.train_loss, r.test_loss, r.test_accuracy, r.train_seconds + r.eval_seconds});
    if (ranks.rank == 0 && !o.checkpoint.empty()) {
      SavePoint at;
      at.train_examples = data.train->size();
      at.epoch = epoch + 1;
      at.global_step = global_step;
      at.workers = ranks.workers;
      at.test_accuracy = r.test_accuracy;
      at.history = history;
      save_checkpoint(o, at, state);
    }
    if (print)  // FLOP/s per device: each of the ranks trains images_per_sec / workers
      print_epoch_line(o, epoch, r, seconds_since(epoch_start),
                       r.images_per_sec > 0 ? image_flops.suffix(ranks.workers / r.images_per_sec) : "");
  }

  const bool replicas_equal = dist ? dist->finish_and_compare_replicas() : true;
  if (ranks.rank != 0) return replicas_equal ? 0 : 1;
  return report_on_rank0(o, plan, data, results, history, dist.get(), replicas_equal,
                         state.scaler.get(), graph ? graph->replays() : 0);
}

// A rank of a run whose ranks are threads (local:N, nccl:N): a rank that fails says so on its
// own line, as a process under mpirun does, so that each survivor's error (which names the
// rank that died) is seen, not only the first failure that run_local rethrows.
int train_rank_saying_why(Options o, const CLI::App& app, Device device,
                          const apps::TrainCheckpoint& resumed,
                          const std::shared_ptr<comm::Transport>& t) {
  try {
    return train_rank(std::move(o), app, device, resumed, t);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "mnist_train: rank %d: error: %s\n", t->rank(), e.what());
    std::fflush(stderr);
    throw;
  }
}

// Runs `ranks` ranks as threads through `launch` (comm::run_local or comm::run_nccl_local, which
// fail the other ranks when one throws and rethrow its error); returns the highest rank's code.
template <typename Launch>
int train_thread_ranks(Launch launch, int ranks, const Options& o, const CLI::App& app,
                       Device device, const apps::TrainCheckpoint& resumed) {
  std::atomic<int> rc{0};
  launch(ranks, [&](std::shared_ptr<comm::Transport> t) {
    const int r = train_rank_saying_why(o, app, device, resumed, t);
    int prev = rc.load();
    while (r > prev && !rc.compare_exchange_weak(prev, r)) {
    }
  });
  return rc.load();
}

// With one rank per process (mpi, nccl), each process writes its own trace: rank 0 to PATH,
// rank r to PATH with ".rank<r>" before the extension (run.json, run.rank1.json, ...).
std::string rank_trace_path(const std::string& path, int rank) {
  if (path.empty() || rank == 0) return path;
  const std::filesystem::path p(path);
  const std::string tag = ".rank" + std::to_string(rank);
  return (p.parent_path() / (p.stem().string() + tag + p.extension().string())).string();
}

// --trace: writes the timeline recorded so far, also after a failed run (it shows where the
// run was). Returns the exit code, raised to 1 when the file cannot be written.
int write_trace(const Options& o, int rc) {
  if (o.trace.empty() || !trace::Tracer::global().enabled()) return rc;  // off, or a usage error
  try {
    trace::Tracer::global().write_chrome_json(o.trace, "--trace");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist_train: error: %s\n", e.what());
    return std::max(rc, 1);
  }
  return rc;
}

// Resuming: the checkpoint decides the seed and the epoch to start from (o.seed is set from
// it). Without --resume, an empty checkpoint.
apps::TrainCheckpoint read_resumed_checkpoint(Options& o, const CLI::App& app) {
  apps::TrainCheckpoint resumed;
  if (o.resume.empty()) return resumed;
  resumed = apps::read_train_checkpoint(o.resume, o.model, o.optimizer);
  if (app.count("--seed") > 0 && o.seed != resumed.seed) {
    throw Error("--seed " + std::to_string(o.seed) + " differs from the seed of " + o.resume +
                " (" + std::to_string(resumed.seed) + "): drop --seed when resuming",
                ErrorKind::Usage);
  }
  o.seed = resumed.seed;
  if (resumed.epoch >= o.epochs) {
    throw Error(o.resume + " already holds " + std::to_string(resumed.epoch) + " epochs: pass "
                "--epochs greater than that to train further", ErrorKind::Usage);
  }
  return resumed;
}

// Sets o.trace to this process's trace file (see rank_trace_path).
int run(Options& o, const CLI::App& app) {
  // `mpirun -np 2 mnist_train` alone: two runs racing to write the same files.
  if (app.count("--dist") == 0) {
    apps::refuse_several_processes_without("--dist", "--dist mpi (or --dist nccl, one GPU each)");
  }
  const DistSpec d = parse_dist(o.dist);
  check_dist_flags(o, app, d);
  check_batch_sizes_fit(o);
  if (d.threads) check_world(o, d.ranks);
  check_output_flags(o);
  check_checkpoint_flags(o);
  check_model_flags(o, app);
  // nccl: each rank trains on its own GPU (train_rank takes it from the transport).
  const Device device = d.kind == "nccl" ? Device() : resolve_device(o.device);
  check_device_flags(o, app, d, device);
  if (!o.kernels.empty()) set_default_impl(parse_impl(o.kernels.c_str()));
  if (!o.trace.empty()) trace::Tracer::global().enable();
  apply_recipe(o, app);
  if (d.kind != "nccl") apps::setup_precision(o.precision, device);  // refuse before any work
  if (o.lr == 0) o.lr = o.optimizer == "sgd" ? 0.01 : o.optimizer == "adam" ? 1e-3 : 1.0;
  check_schedule_flags(o, app);

  const apps::TrainCheckpoint resumed = read_resumed_checkpoint(o, app);

  if (d.kind == "none") return train_rank(o, app, device, resumed, nullptr);
  if (d.kind == "local") {
    // Every rank a thread with its own model, generator and thread budget; when one fails,
    // run_local fails the others and rethrows its error.
    return train_thread_ranks(comm::run_local, d.ranks, o, app, device, resumed);
  }
  if (d.kind == "nccl" && d.threads) {
#if KILN_WITH_NCCL
    // The same with NCCL between the threads, rank r on cuda:r; a rank that fails aborts the
    // NCCL communicator, so the others stop waiting for it.
    return train_thread_ranks(comm::run_nccl_local, d.ranks, o, app, device, resumed);
#else
    throw Error("--dist " + o.dist + ": this build has no NCCL (it needs a CUDA build with NCCL, "
                "or the CUDA simulator: -DKILN_CUDA_SIM=ON); use local:N", ErrorKind::Usage);
#endif
  }
  // mpi / nccl: one rank per process.
  std::shared_ptr<comm::Transport> t = comm::make_transport(d.kind);
  o.trace = rank_trace_path(o.trace, t->rank());
  // Before any other message: ranks started with other flags would hang or part ways.
  if (const int rc = apps::refuse_unless_ranks_agree("mnist_train", *t,
                                                     flags_every_rank_shares(o, resumed))) {
    return rc;
  }
  try {
    check_world(o, t->size());  // the same verdict on every rank: all exit 2, none hangs
  } catch (const Error& e) {
    if (t->rank() == 0) std::fprintf(stderr, "mnist_train: error: %s\n", e.what());
    return e.exit_code();
  }
  try {
    return train_rank(o, app, device, resumed, t);
  } catch (const std::exception& e) {
    // One rank failing must not leave the others waiting forever: stop the whole job.
    std::fflush(stdout);
    std::fprintf(stderr, "mnist_train: rank %d: error: %s\n", t->rank(), e.what());
    std::fflush(stderr);
    t->abort(std::string("rank ") + std::to_string(t->rank()) + ": " + e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mnist_train: train a CNN or an MLP on MNIST with Kiln (defaults reach >= 99% "
               "test accuracy)"};
  Options o;
  add_flags(app, o);
  if (const std::optional<int> rc = apps::parse_flags(app, argc, argv, "mnist_train")) return *rc;
  // Under mpirun every rank finds the same bad flag: rank 0 alone says so.
  const bool say = !apps::launched_as_nonzero_rank();
  int rc = 0;
  try {
    rc = run(o, app);
  } catch (const OutOfMemory& e) {
    // Every buffer's size follows from the flags: out of memory means they chose too much.
    std::fflush(stdout);
    const Error sized = apps::size_error(e, "--batch-size " + std::to_string(o.batch_size) +
                                                " and --eval-batch-size " +
                                                std::to_string(o.eval_batch_size));
    if (say) std::fprintf(stderr, "mnist_train: error: %s\n", sized.what());
    rc = sized.exit_code();
  } catch (const Error& e) {
    std::fflush(stdout);
    if (say) std::fprintf(stderr, "mnist_train: error: %s\n", e.what());
    rc = e.exit_code();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    if (say) std::fprintf(stderr, "mnist_train: error: %s\n", e.what());
    rc = 1;
  }
  return write_trace(o, rc);
}
