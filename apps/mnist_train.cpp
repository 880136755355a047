// mnist_train: trains a CNN (or an MLP) on MNIST end to end and reports what it measured.
//
//   mnist_train                       the seed CNN, Adadelta lr 1.0 with StepLR gamma 0.7 per
//                                     epoch, batch 128 (the PyTorch MNIST example recipe): >= 99%
//   mnist_train --model mlp --optimizer sgd --epochs 3 --json out.json
//   mnist_train --checkpoint run.ckpt --epochs 2 ; mnist_train --resume run.ckpt --epochs 4
//   mnist_train --format imagefolder --data DIR --workers 2   (DIR/train/<class>/*.png, DIR/test)
//   mnist_train --dist local:2                       2 data-parallel ranks as threads
//   mpirun -np 2 mnist_train --dist mpi --allreduce ring      2 processes (any hosts)
//   mnist_train --dist local:3 --allreduce ps --ps-servers 1 --ps-async   async parameter server
//
// Data parallelism (--dist; comm/data_parallel.h): every rank holds a replica of the model and
// trains on its shard of the data (DistributedSampler: the same epoch order on every rank, rank
// r takes every N-th example). --batch-size is the GLOBAL batch, split evenly over the worker
// ranks, and gradients are averaged over them, so N ranks compute what one rank computes with
// the same flags (the same >= 99%), only faster. --batch-per-rank is Horovod's recipe instead:
// --batch-size per rank, the learning rate multiplied by the number of workers, reached by a
// linear warm-up over --warmup-epochs (Goyal et al. 2017). Rank 0 alone prints, evaluates, writes
// the JSON and the checkpoints; at the end every rank compares its weights with rank 0's, bit
// for bit, and says so. An error on one rank stops all of them (local: run_local; mpi: abort).
//
// What a run does, in order: parse flags (CLI11), choose the device and the thread budget,
// seed the Philox generator (initialisation and dropout draw from it), load MNIST, then per
// epoch: train over a seeded random permutation (RandomSampler: a pure function of
// (seed, epoch)) fed by the asynchronous Loader (data/loader.h: --workers threads build the
// next batches while the model trains; the batches are the same bits for any worker count),
// evaluate on the test set in eval mode under NoGradGuard, print one line, and save a
// checkpoint. At the end, an optional JSON summary.
//
// Resuming reproduces an uninterrupted run bit for bit (for the same flags and thread count):
// the checkpoint holds the model and optimizer state plus the generator's (seed, offset), the
// sampler is re-derived from (seed, epoch) and the learning-rate schedule is a pure function
// of the epoch, so nothing else carries state from one epoch to the next.
//
// Exit codes (ARCHITECTURE.md): 0 ok; 2 bad usage or bad input (flags, data, checkpoint);
// 1 a runtime failure. Every error message says what to do.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#if KILN_CUDA_SIM
#define KILN_CUDA_SIM_BUILD true
#include "engine/cuda/caching_allocator.h"
#elif KILN_WITH_CUDA
#define KILN_CUDA_SIM_BUILD false
#include "engine/cuda/caching_allocator.h"
#else
#define KILN_CUDA_SIM_BUILD false
#endif

#include "apps/common/progress.h"
#include "comm/communicator.h"
#include "comm/data_parallel.h"
#include "comm/local_transport.h"
#include "comm/parameter_server.h"
#include "apps/common/train_checkpoint.h"
#include "data/batch_iterator.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "data/transforms.h"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/impl.h"
#include "engine/ops.h"
#include "engine/optim/adadelta.h"
#include "engine/optim/adam.h"
#include "engine/optim/lr_schedule.h"
#include "engine/optim/sgd.h"
#include "engine/parallel.h"
#include "engine/philox.h"
#include "layers/loss.h"
#include "models/mlp.h"
#include "models/mnist_cnn.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

using namespace kiln;
using apps::Clock;
using apps::seconds_since;

namespace {

// The default epoch count: the smallest that stays >= 99.0% test accuracy with every other
// flag at its default. Measured (2 threads): seed 1: 97.93, 98.80, 98.74, 98.92, 99.00, 99.05%
// after epochs 1..6, then 99.02, 99.04; seed 2: 99.13% after 6. More epochs buy no margin:
// with StepLR 0.7 the learning rates sum to at most 3.3 epochs' worth (gamma 0.8 and batch 64
// gave the same plateau, 99.0-99.1%), so 6 epochs is where the curve has flattened.
constexpr int kDefaultEpochs = 6;

// The default number of loader worker threads: 1. Measured on this 2-core machine (default
// CNN, --limit-train 10000 --epochs 1, 2 OpenMP threads, 3 interleaved runs each, while other
// jobs kept the load average near 7): train img/s workers 0: 222, 212, 664; workers 1: 239,
// 309, 260; workers 2: 244, 663, 351 -- the spread comes from the machine, not the loader.
// What the loader costs is in loader_wait_fraction: IDX 0.02-0.15% of the training loop with
// 0 workers, 0.15-0.18% with 1, 0.08-1.2% with 2; --format imagefolder (PNG decoding) 0.95%
// with 0 workers, 0.54% with 1, 0.95% with 2. So for MNIST on 2 cores the choice is worth
// under 1%: one worker takes the decoding off the training thread (it matters with PNGs and on
// a GPU, where a step is milliseconds) without adding a third busy thread to two cores.
constexpr int kDefaultWorkers = 1;

// The default gradient bucket: 1 MiB, not DataParallel's 25 MiB. The seed CNN's gradients are
// 4.8 MB, 98% of them fc1's weight, so with 25 MiB they travel as ONE bucket, launched when
// backward is over: nothing overlaps (overlap_fraction 0.01-0.03). With 1 MiB fc1's weight goes
// alone as soon as backward has produced it, while conv2's backward (most of the work) runs:
// overlap_fraction 0.69-0.83. Measured, mpirun -np 2 --threads 1 --limit-train 10000 on this
// 2-core machine (busy, so read ratios): 1 MiB 1662-1790 img/s, 25 MiB 902-1672 img/s, against
// 720-1064 img/s for --dist none; the local transport showed no clear difference.
constexpr double kDefaultBucketMb = 1;

struct Options {
  std::string device = "auto";
  std::string model = "cnn";
  int epochs = kDefaultEpochs;
  int64_t batch_size = 128;
  // The PyTorch example evaluates in batches of 1000; at 1000 the CNN's activations alone
  // (conv2 output and its ReLU: 2 x 147 MB) double the peak RSS of a default run (844 MB vs
  // 432 MB measured) for no gain in speed, so 250.
  int64_t eval_batch_size = 250;
  double lr = 0;  // 0: the optimizer's default (set after parsing)
  double gamma = 0.7;
  std::string optimizer = "adadelta";
  int threads = 1;
  uint64_t seed = 1;
  std::string data;
  int64_t limit_train = -1, limit_test = -1;
  std::string checkpoint, resume, json;
  bool quiet = false;
  std::string kernels;
  int workers = kDefaultWorkers;
  int prefetch = 2;
  bool pin_memory = false;
  std::string format = "idx";
  // Data parallelism.
  std::string dist = "none";
  std::string allreduce = "ring";
  int ps_servers = 0;
  bool ps_async = false;
  int ps_staleness = 2;
  double bucket_mb = kDefaultBucketMb;
  bool fp16_allreduce = false;
  bool batch_per_rank = false;
  double warmup_epochs = -1;  // -1: not given (1 with --batch-per-rank)
};

std::string default_data_dir() {
  const std::filesystem::path in_tree = std::filesystem::path(KILN_SOURCE_DIR) / "datasets" / "mnist";
  std::error_code ec;
  if (std::filesystem::is_directory(in_tree, ec)) return in_tree.string();
  return "datasets/mnist";
}

void add_flags(CLI::App& app, Options& o) {
  app.add_option("--device", o.device, "auto | cpu | cpu:N | cuda | cuda:N (auto: a GPU if this "
                 "build has a CUDA backend and one is present, else the CPU)")->capture_default_str();
  app.add_option("--model", o.model, "cnn (the seed CNN, 1.2 M parameters) | mlp (784-512-256-10)")
      ->check(CLI::IsMember({"cnn", "mlp"}))->capture_default_str();
  app.add_option("--epochs", o.epochs, "total number of epochs (a resumed run continues up to it)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "training batch size")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--eval-batch-size", o.eval_batch_size, "evaluation batch size (larger is faster; "
                 "smaller needs less memory)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr, "base learning rate (default: adadelta 1.0, sgd 0.01, adam 0.001)")
      ->check(CLI::PositiveNumber);
  app.add_option("--gamma", o.gamma, "StepLR factor applied to the learning rate after each epoch")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adadelta | sgd (momentum 0.9) | adam")
      ->check(CLI::IsMember({"adadelta", "sgd", "adam"}))->capture_default_str();
  o.threads = hardware_threads();
  app.add_option("--threads", o.threads, "CPU threads (OpenMP, BLAS and oneDNN share them; default: "
                 "the cores this process may use; with --dist, divided by the ranks on this host)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seed", o.seed, "seed of initialisation, dropout and shuffling")->capture_default_str();
  o.data = default_data_dir();
  app.add_option("--data", o.data, "directory holding the four MNIST IDX files (run "
                 "datasets/fetch_mnist.sh to get them), or with --format imagefolder the folders "
                 "train/<class>/*.png and test/<class>/*.png (apps/idx_to_imagefolder writes "
                 "them)")->capture_default_str();
  app.add_option("--format", o.format, "idx (the four MNIST files) | imagefolder (one PNG per "
                 "image: decoding them is real work for the loader's workers)")
      ->check(CLI::IsMember({"idx", "imagefolder"}))->capture_default_str();
  app.add_option("--workers", o.workers, "loader worker threads building batches ahead of the "
                 "training loop (0: build each batch in the loop itself)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--prefetch", o.prefetch, "batches the loader builds ahead, at most")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--pin-memory", o.pin_memory, "stage batches in page-locked host memory (always "
               "on when training on a GPU; needs a build with CUDA)");
  app.add_option("--limit-train", o.limit_train, "train on the first N training images only "
                 "(imagefolder: N images spread evenly over the classes)")
      ->check(CLI::PositiveNumber);
  app.add_option("--limit-test", o.limit_test, "evaluate on the first N test images only "
                 "(imagefolder: spread evenly)")
      ->check(CLI::PositiveNumber);
  app.add_option("--checkpoint", o.checkpoint, "save model + optimizer + RNG state here after each epoch");
  app.add_option("--resume", o.resume, "continue a run from this checkpoint (same flags give the same "
                 "result, bit for bit, as an uninterrupted run)");
  app.add_option("--json", o.json, "write a JSON summary of the run here");
  app.add_flag("--quiet,-q", o.quiet, "print nothing but errors (the JSON summary is still written)");
  app.add_option("--dist", o.dist, "none | local:N (N data-parallel ranks as threads of this "
                 "process) | mpi (one rank per process: launch with mpirun -np N) | nccl (one "
                 "rank per GPU, under mpirun)")->capture_default_str();
  app.add_option("--allreduce", o.allreduce, "how gradients are averaged: ring | hd "
                 "(halving-doubling) | ps (parameter server) | native (MPI_Allreduce / "
                 "ncclAllReduce; mpi and nccl only)")
      ->check(CLI::IsMember({"ring", "hd", "ps", "native"}))->capture_default_str();
  app.add_option("--ps-servers", o.ps_servers, "with --allreduce ps: dedicated server ranks, the "
                 "last S ranks (0: one shard on every worker rank)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_flag("--ps-async", o.ps_async, "asynchronous parameter server: workers push gradients "
               "and pull parameters without a global barrier (needs --allreduce ps and "
               "--ps-servers >= 1)");
  app.add_option("--ps-staleness", o.ps_staleness, "with --ps-async: how many steps a worker may "
                 "run ahead of the slowest one")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "gradient fusion bucket size in MiB (the allreduce "
                 "of a full bucket starts while backward goes on)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--fp16-allreduce", o.fp16_allreduce, "send gradients as IEEE half (half the bytes "
               "on the wire)");
  app.add_flag("--batch-per-rank", o.batch_per_rank, "Horovod's recipe: --batch-size is per worker "
               "rank (the global batch grows with the ranks) and the learning rate is multiplied "
               "by the number of workers after a linear warm-up (--warmup-epochs)");
  app.add_option("--warmup-epochs", o.warmup_epochs, "with --batch-per-rank: epochs of linear "
                 "learning-rate warm-up from --lr to --lr x workers (default 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kernels", o.kernels, "hand (our kernels: im2col + GEMM) | vendor (oneDNN on "
                 "the CPU, cuBLAS/cuDNN on a GPU); default: $KILN_KERNELS or vendor (hand in the "
                 "CUDA simulator)")->check(CLI::IsMember({"hand", "vendor"}));
}

// Whether CUDA tensors of this build run on the CUDA simulator (a test instrument, not a GPU).
constexpr bool kSimulated = KILN_CUDA_SIM_BUILD;

// "auto" -> cuda:0 when a real GPU is present, else the CPU (never the simulator: it is for
// tests, not training); "cuda[:N]" -> that device, or a usage error saying why it is missing.
Device resolve_device(const std::string& spec) {
  if (spec == "auto") {
    return !kSimulated && cuda::is_available() ? Device(DeviceType::CUDA, 0)
                                               : Device(DeviceType::CPU, 0);
  }
  Device d = parse_device(spec);
  if (d.is_cuda()) {
    if (!cuda::is_available()) {
      throw Error("--device " + spec + ": " + cuda::unavailable_reason(), ErrorKind::Usage);
    }
    cuda::check_device(d.index);
  }
  return d;
}

// The kernels a device runs: the CPU choice, or the CUDA one (hand by default in the simulator).
Impl impl_for(Device device) { return device.is_cuda() ? cuda_kernel_impl() : kernel_impl(); }

std::unique_ptr<Optimizer> make_optimizer(const Options& o, const std::vector<Tensor>& params) {
  if (o.optimizer == "sgd") return std::make_unique<SGD>(params, o.lr, /*momentum=*/0.9);
  if (o.optimizer == "adam") return std::make_unique<Adam>(params, o.lr);
  return std::make_unique<Adadelta>(params, o.lr);
}

MemoryStats device_memory_stats(Device device) {
#if KILN_WITH_CUDA
  if (device.is_cuda()) return cuda_allocator::stats(device.index);
#endif
  return cpu_allocator::stats();
}

// Hands the CPU allocator's cache back to the OS (see evaluate()). On a GPU the phases' blocks
// fit side by side, and cudaFree/cudaMalloc would stall the device: the cache stays.
void release_cached(Device device) {
  if (device.is_cpu()) cpu_allocator::release_cached();
}

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

struct EpochResult {
  double train_loss = 0;      // mean over the epoch's training examples
  double train_seconds = 0;   // the training loop only (batches + steps)
  double wait_seconds = 0;    // of which the loop waited for batches
  double images_per_sec = 0;  // training images / train_seconds (all ranks' images)
  int64_t train_seen = 0;     // training images of this rank
  double test_loss = 0, test_accuracy = 0;
  double eval_seconds = 0;
};

// What a training step does once the loss is computed: backward and the update (plain, with
// DataParallel's gradient averaging, or through the asynchronous parameter server).
using StepFn = std::function<void(Tensor& loss)>;

// One pass over the training set. Fills the training fields of `r`.
void train_epoch(Module& model, const StepFn& step_fn, BatchSource& source, Device device,
                 int epoch, int epochs, bool progress, EpochResult& r) {
  model.train();
  source.start_epoch(epoch);
  apps::ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs),
                        source.num_batches(), progress);
  // Reading a loss on the host waits for the device. On a GPU, reading it every step would
  // stall the launch queue once per step, so losses are kept on the device and read in groups
  // (every kReadEvery steps and at the end): the GPU stays busy, and divergence is still caught
  // within a few steps.
  const int kReadEvery = device.is_cuda() ? 32 : 1;
  std::vector<std::pair<Tensor, int64_t>> pending;  // (loss on the device, batch size)
  double loss_sum = 0;
  int64_t seen = 0, step = 0;
  const auto start = Clock::now();
  auto read_pending = [&] {
    for (auto& [loss, n] : pending) {
      const double l = loss.item();
      ++step;
      KILN_CHECK(std::isfinite(l), "training diverged: the loss is ", l, " at epoch ", epoch + 1,
                 ", step ", step, ". Lower --lr.");
      loss_sum += l * static_cast<double>(n);
      seen += n;
      bar.update(step, l, static_cast<double>(seen) / seconds_since(start));
    }
    pending.clear();
  };
  for (Batch b; source.next(b);) {
    Tensor x = b.inputs.device() == device ? b.inputs : b.inputs.to(device);
    Tensor y = b.labels.device() == device ? b.labels : b.labels.to(device);
    Tensor loss = cross_entropy(model(x), y);
    step_fn(loss);
    pending.emplace_back(loss.detach(), b.inputs.size(0));
    if (static_cast<int>(pending.size()) >= kReadEvery) read_pending();
  }
  read_pending();  // also waits for the last step: the epoch's time is complete
  r.train_seconds = seconds_since(start);
  bar.clear();
  r.wait_seconds = source.wait_seconds();
  r.train_loss = seen > 0 ? loss_sum / static_cast<double>(seen) : 0.0;
  r.train_seen = seen;
  r.images_per_sec = r.train_seconds > 0 ? static_cast<double>(seen) / r.train_seconds : 0.0;
}

// Accuracy and mean loss on the test set, in eval mode (dropout off), recording nothing.
// Training and evaluation allocate different tensor sizes, and the caching allocator keeps
// every freed block for reuse: holding both sets would add the two phases' memory together
// in RSS. Handing the cache back at each phase change costs one round of page faults per
// epoch (milliseconds) and keeps the peak at the larger phase instead of their sum.
void evaluate(Module& model, BatchSource& source, Device device, EpochResult& r) {
  release_cached(device);
  NoGradGuard no_grad;
  model.eval();
  source.start_epoch(0);
  const auto start = Clock::now();
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  for (Batch b; source.next(b);) {
    Tensor x = b.inputs.device() == device ? b.inputs : b.inputs.to(device);
    Tensor y = b.labels.device() == device ? b.labels : b.labels.to(device);
    Tensor logits = model(x);
    const int64_t n = b.inputs.size(0);
    loss_sum += cross_entropy(logits, y).item() * static_cast<double>(n);
    const std::vector<int64_t> pred = argmax(logits, 1).to_vector<int64_t>();
    const std::vector<int64_t> truth = b.labels.to_vector<int64_t>();
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == truth[i];
    seen += n;
  }
  release_cached(device);
  r.eval_seconds = seconds_since(start);
  r.test_accuracy = seen > 0 ? static_cast<double>(correct) / static_cast<double>(seen) : 0.0;
  r.test_loss = seen > 0 ? loss_sum / static_cast<double>(seen) : 0.0;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) {
    throw Error("cannot write the JSON summary to '" + path + "': check that its directory "
                "exists and is writable", ErrorKind::Input);
  }
}

// Fails now, not after an hour of training, when an output file cannot be created.
void check_output_path(const std::string& path, const char* flag) {
  if (path.empty()) return;
  const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw Error(std::string(flag) + " " + path + ": the directory " + dir.string() +
                " does not exist: create it first", ErrorKind::Usage);
  }
}

// The training and test sets in the --format asked for, and the transform they need.
struct Datasets {
  std::unique_ptr<Dataset> train, test;
  std::shared_ptr<const Compose> transform;  // null: examples arrive ready (IDX: normalised)
};

// The first `limit` examples of an ImageFolder would all be of class 0 (examples are sorted
// by class), so --limit-* takes `limit` examples spread evenly over the whole set instead.
class SpreadSubset : public Dataset {
 public:
  SpreadSubset(std::unique_ptr<Dataset> base, int64_t limit)
      : base_(std::move(base)), n_(std::min(limit, base_->size())) {}
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return base_->example_shape(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  int64_t get(int64_t index, float* out) const override {
    KILN_CHECK_INPUT(index >= 0 && index < n_, "SpreadSubset: index ", index, " out of range");
    return base_->get(index * base_->size() / n_, out);
  }
  std::string describe() const override {
    return base_->describe() + ", " + std::to_string(n_) + " of them used";
  }

 private:
  std::unique_ptr<Dataset> base_;
  int64_t n_;
};

Datasets load_datasets(const Options& o) {
  Datasets d;
  if (o.format == "idx") {
    d.train = std::make_unique<MnistDataset>(MnistDataset::load(o.data, MnistSplit::Train, o.limit_train));
    d.test = std::make_unique<MnistDataset>(MnistDataset::load(o.data, MnistSplit::Test, o.limit_test));
    return d;
  }
  // ImageFolder: PNGs decode to pixel / 255.0f; Normalize then computes (x - 0.1307f) / 0.3081f
  // in float32, the very expression of MnistDataset::normalize_pixel: the same bits as IDX.
  ImageFolderOptions grey28;
  grey28.channels = 1;
  grey28.height = grey28.width = 28;
  auto open = [&](const char* split, int64_t limit) -> std::unique_ptr<Dataset> {
    const std::string root = (std::filesystem::path(o.data) / split).string();
    auto set = std::make_unique<ImageFolderDataset>(ImageFolderDataset::open(root, grey28));
    KILN_CHECK_INPUT(set->num_classes() == 10, root, " holds ", set->num_classes(),
                     " class folders; MNIST needs 10 (0..9)");
    if (limit > 0 && limit < set->size()) return std::make_unique<SpreadSubset>(std::move(set), limit);
    return set;
  };
  d.train = open("train", o.limit_train);
  d.test = open("test", o.limit_test);
  d.transform = std::make_shared<const Compose>(
      Shape{1, 28, 28}, std::vector<std::shared_ptr<const Transform>>{std::make_shared<Normalize>(
                            std::vector<float>{MnistDataset::kMean},
                            std::vector<float>{MnistDataset::kStd})});
  return d;
}

// ---- Data parallelism ---------------------------------------------------------------------

struct DistSpec {
  std::string kind = "none";  // none | local | mpi | nccl
  int ranks = 1;              // local:N
};

DistSpec parse_dist(const std::string& s) {
  DistSpec d;
  if (s == "none" || s == "mpi" || s == "nccl") {
    d.kind = s;
    return d;
  }
  if (s.rfind("local:", 0) == 0) {
    const std::string n = s.substr(6);
    char* end = nullptr;
    const long v = std::strtol(n.c_str(), &end, 10);
    if (!n.empty() && *end == '\0' && v >= 1 && v <= 64) {
      d.kind = "local";
      d.ranks = static_cast<int>(v);
      return d;
    }
  }
  throw Error("--dist " + s + ": use none, local:N (N = 1..64 ranks as threads), mpi (launch "
              "with mpirun -np N) or nccl", ErrorKind::Usage);
}

// Flag combinations that make no sense whatever the number of ranks.
void check_dist_flags(const Options& o, const CLI::App& app, const DistSpec& d) {
  const bool ps = o.allreduce == "ps";
  if (o.ps_async && !(ps && o.ps_servers >= 1)) {
    throw Error("--ps-async needs --allreduce ps and --ps-servers >= 1 (dedicated server ranks "
                "that hold the parameters), e.g. --dist local:3 --allreduce ps --ps-servers 1 "
                "--ps-async", ErrorKind::Usage);
  }
  if (o.ps_servers > 0 && !ps) {
    throw Error("--ps-servers " + std::to_string(o.ps_servers) + " needs --allreduce ps",
                ErrorKind::Usage);
  }
  if (app.count("--ps-staleness") > 0 && !o.ps_async) {
    throw Error("--ps-staleness applies to the asynchronous parameter server: add --ps-async",
                ErrorKind::Usage);
  }
  if (o.warmup_epochs >= 0 && !o.batch_per_rank) {
    throw Error("--warmup-epochs belongs to the large-minibatch recipe: add --batch-per-rank "
                "(or drop --warmup-epochs)", ErrorKind::Usage);
  }
  if (o.allreduce == "native" && (d.kind == "local" || d.kind == "none")) {
    throw Error("--allreduce native is MPI_Allreduce / ncclAllReduce: use it with --dist mpi or "
                "nccl; local ranks use ring, hd or ps", ErrorKind::Usage);
  }
  if (o.fp16_allreduce && o.ps_async) {
    throw Error("--fp16-allreduce compresses allreduced gradients; the asynchronous parameter "
                "server pushes f32: drop one of the two", ErrorKind::Usage);
  }
  if (o.fp16_allreduce && d.kind == "nccl") {
    throw Error("--fp16-allreduce is implemented for host transports (local, mpi), not nccl: "
                "drop it with --dist nccl", ErrorKind::Usage);
  }
  if (o.ps_async && (!o.checkpoint.empty() || !o.resume.empty())) {
    throw Error("--checkpoint/--resume with --ps-async: the optimizer state lives on the server "
                "ranks and is not saved; train synchronously (drop --ps-async) to checkpoint",
                ErrorKind::Usage);
  }
  if (d.kind == "none" && (o.ps_servers > 0 || app.count("--allreduce") > 0 ||
                           o.fp16_allreduce || app.count("--bucket-mb") > 0)) {
    throw Error("--allreduce, --ps-*, --bucket-mb and --fp16-allreduce need several ranks: add "
                "--dist local:N, mpi or nccl", ErrorKind::Usage);
  }
}

// Checks that need the world size (known at once for local:N, after MPI started for mpi).
void check_world(const Options& o, int world) {
  const int servers = o.allreduce == "ps" ? o.ps_servers : 0;
  if (servers >= world) {
    throw Error("--ps-servers " + std::to_string(servers) + " leaves no worker among " +
                std::to_string(world) + " ranks: use more ranks or fewer servers",
                ErrorKind::Usage);
  }
  const int workers = world - servers;
  if (!o.batch_per_rank && o.batch_size % workers != 0) {
    throw Error("--batch-size " + std::to_string(o.batch_size) + " is the global batch and must "
                "split evenly over the " + std::to_string(workers) + " worker ranks: use a "
                "multiple of " + std::to_string(workers) + ", or --batch-per-rank",
                ErrorKind::Usage);
  }
}

// Rank r > 0 draws its dropout masks from its own Philox key, so the ranks' masks are
// independent; rank 0 keeps the seed's stream (the same masks as a 1-rank run).
std::string format_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

uint64_t rank_stream_key(uint64_t seed, int rank) {
  return seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank));
}

std::vector<Tensor> grads_or_zeros(const std::vector<Tensor>& params) {
  std::vector<Tensor> g;
  for (const Tensor& p : params) {
    g.push_back(p.grad().defined() ? p.grad() : Tensor::zeros(p.shape(), p.dtype(), p.device()));
  }
  return g;
}

// ---- One rank ------------------------------------------------------------------------------

// Trains as rank t->rank() of the group (t null: --dist none, the plain single-process run).
// Returns the exit code.
int train_rank(Options o, const CLI::App& app, Device device, const apps::TrainCheckpoint& resumed,
               const std::shared_ptr<comm::Transport>& t) {
  const bool dist = t != nullptr;
  const int world = dist ? t->size() : 1;
  const int rank = dist ? t->rank() : 0;
  const comm::Algorithm alg = comm::parse_algorithm(o.allreduce);
  const int servers = alg == comm::Algorithm::ParameterServer ? o.ps_servers : 0;
  const int workers = world - servers;
  const bool print = !o.quiet && rank == 0;
  if (dist && t->device().is_cuda()) device = t->device();  // nccl: this rank's GPU
  if (dist && app.count("--threads") == 0) {
    o.threads = std::max(1, hardware_threads() / std::max(1, t->local_size()));
  }
  set_num_threads(o.threads);

  comm::PsOptions po;
  po.workers = workers;
  po.servers = servers;
  po.async = o.ps_async;
  po.staleness = o.ps_staleness;
  if (rank >= workers) {  // a dedicated parameter-server rank
    if (o.ps_async) {
      comm::serve(*t, po, [&o](std::vector<Tensor> p) { return make_optimizer(o, p); });
    } else {
      comm::serve(*t, po);
    }
    return 0;
  }

  // Each local rank draws from its own generator (a thread of this process).
  Generator rank_generator(o.seed);
  std::optional<GeneratorScope> generator_scope;
  if (dist) generator_scope.emplace(rank_generator);

  manual_seed(o.seed);  // before the model: initialisation draws from the generator
  std::shared_ptr<Module> model =
      o.model == "cnn" ? std::shared_ptr<Module>(make_mnist_cnn()) : std::shared_ptr<Module>(make_mlp());
  model->to(device);
  std::vector<Tensor> params = model->parameters();
  std::unique_ptr<Optimizer> opt = make_optimizer(o, params);
  int start_epoch = 0;
  if (!o.resume.empty()) {
    apps::restore_train_checkpoint(resumed, o.resume, *model, *opt);
    start_epoch = static_cast<int>(resumed.epoch);
  }
  if (dist && rank > 0) {
    default_generator().set_state(rank_stream_key(o.seed, rank), default_generator().offset());
  }

  std::shared_ptr<comm::Communicator> communicator;
  std::unique_ptr<comm::DataParallel> dp;
  std::unique_ptr<comm::AsyncPsWorker> ps;
  std::vector<float> ps_params;  // async: the flat parameter vector pulled from the servers
  if (dist) {
    comm::AlgorithmOptions ao;
    ao.ps_servers = servers;
    communicator = std::make_shared<comm::Communicator>(t, workers, ao);
    if (o.ps_async) {
      ps_params = comm::flatten_to_host(params);
      ps = std::make_unique<comm::AsyncPsWorker>(*t, po, static_cast<int64_t>(ps_params.size()));
      ps->init(ps_params.data());  // worker 0's parameters, through the servers
      comm::unflatten_from_host(ps_params, params);
    } else {
      comm::DataParallelOptions dpo;
      dpo.bucket_bytes = static_cast<size_t>(o.bucket_mb * 1024 * 1024);
      dpo.algorithm = alg;
      dpo.fp16 = o.fp16_allreduce;
      std::vector<Tensor> buffers;
      for (auto& [name, b] : model->named_buffers()) buffers.push_back(b);
      dp = std::make_unique<comm::DataParallel>(communicator, params, buffers, dpo);
    }
  }

  const Datasets data = load_datasets(o);
  const Dataset& train_set = *data.train;
  const Dataset& test_set = *data.test;
  const int64_t rank_batch = !dist || o.batch_per_rank ? o.batch_size : o.batch_size / workers;
  const int64_t global_batch = o.batch_per_rank ? o.batch_size * workers : o.batch_size;
  // The loaders deliver batches on the training device (a GPU: pinned slots, copy stream).
  LoaderOptions lo;
  lo.workers = o.workers;
  lo.prefetch = o.prefetch;
  lo.pin_memory = o.pin_memory;
  lo.device = device;
  lo.transform = data.transform;
  lo.seed = o.seed;
  LoaderOptions train_options = lo, test_options = lo;
  train_options.batch_size = rank_batch;
  test_options.batch_size = o.eval_batch_size;
  std::shared_ptr<Sampler> sampler;
  if (dist) {
    sampler = std::make_shared<DistributedSampler>(train_set.size(), rank, workers,
                                                   /*shuffle=*/true, o.seed);
  } else {
    sampler = std::make_shared<RandomSampler>(train_set.size(), o.seed);
  }
  Loader train_source(train_set, sampler, train_options);
  std::unique_ptr<Loader> test_source;  // rank 0 evaluates
  if (rank == 0) {
    test_source = std::make_unique<Loader>(
        test_set, std::make_shared<SequentialSampler>(test_set.size()), test_options);
  }

  // Learning rate: StepLR per epoch; with --batch-per-rank, the large-minibatch recipe per step.
  const int64_t steps_per_epoch = std::max<int64_t>(1, train_source.num_batches());
  const double warmup_epochs = o.warmup_epochs < 0 ? 1.0 : o.warmup_epochs;
  const int64_t warmup_steps = static_cast<int64_t>(std::llround(warmup_epochs * steps_per_epoch));
  std::shared_ptr<LRSchedule> schedule;
  if (o.batch_per_rank) {
    schedule =
        comm::large_minibatch_schedule(o.lr, workers, warmup_steps, steps_per_epoch, o.gamma);
  } else {
    schedule = std::make_shared<StepLR>(o.lr, /*step_size=*/1, o.gamma);
  }

  if (print) {
    std::printf("mnist_train: %s (%lld parameters) on %s, %d threads%s, %s kernels, %s lr %g "
                "(x%g per epoch), batch %lld, %lld train / %lld test images, seed %llu\n",
                o.model.c_str(), static_cast<long long>(model->num_parameters()),
                (device.str() + (kSimulated && device.is_cuda() ? " (SIMULATED)" : "")).c_str(),
                o.threads, dist ? " per rank" : "", impl_name(impl_for(device)),
                o.optimizer.c_str(),
                o.lr, o.gamma, static_cast<long long>(o.batch_size),
                static_cast<long long>(train_set.size()), static_cast<long long>(test_set.size()),
                static_cast<unsigned long long>(o.seed));
    std::printf("data: %s; loader: %d workers, prefetch %d%s\n", train_set.describe().c_str(),
                o.workers, o.prefetch, o.pin_memory || device.is_cuda() ? ", pinned" : "");
    if (dist) {
      std::string how = "allreduce " + o.allreduce + ", buckets " + format_g(o.bucket_mb) +
                        " MiB" + (o.fp16_allreduce ? ", fp16 on the wire" : "");
      if (o.ps_async) {
        how = "asynchronous parameter server, staleness " + std::to_string(o.ps_staleness);
      }
      std::string ranks = std::to_string(workers) + " workers";
      if (servers > 0) {
        ranks += ", " + std::to_string(servers) + (servers == 1 ? " server" : " servers");
      }
      std::string lr;
      if (o.batch_per_rank) {
        lr = ", lr x" + std::to_string(workers) + " after " + std::to_string(warmup_steps) +
             " warm-up steps";
      }
      std::printf("data parallel: %s, %d ranks (%s), %s, batch %lld per worker = %lld global%s\n",
                  o.dist.c_str(), world, ranks.c_str(), how.c_str(),
                  static_cast<long long>(rank_batch), static_cast<long long>(global_batch),
                  lr.c_str());
    }
    if (start_epoch > 0) std::printf("resumed from %s after epoch %d\n", o.resume.c_str(), start_epoch);
    std::fflush(stdout);
  }

  // The training step.
  int64_t global_step = static_cast<int64_t>(start_epoch) * steps_per_epoch;
  double ps_seconds = 0;
  const StepFn step_fn = [&](Tensor& loss) {
    if (o.batch_per_rank) schedule->apply(*opt, global_step);
    ++global_step;
    if (ps) {
      model->zero_grad();
      loss.backward();
      const std::vector<float> g = comm::flatten_to_host(grads_or_zeros(params));
      const auto start = Clock::now();
      ps->push_pull(g.data(), ps_params.data(), opt->lr());
      ps_seconds += seconds_since(start);
      comm::unflatten_from_host(ps_params, params);
      return;
    }
    opt->zero_grad();
    loss.backward();  // DataParallel's hooks start bucket allreduces from here
    if (dp) dp->synchronize();
    opt->step();
  };

  std::vector<EpochResult> results;
  for (int epoch = start_epoch; epoch < o.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    if (!o.batch_per_rank) schedule->apply(*opt, epoch);
    EpochResult r;
    train_epoch(*model, step_fn, train_source, device, epoch, o.epochs, print, r);
    if (dist) {  // the epoch's loss and images over all workers
      Tensor sums = Tensor::from_vector<double>(
          {r.train_loss * static_cast<double>(r.train_seen), static_cast<double>(r.train_seen)},
          {2}, t->device());
      communicator->allreduce(sums, comm::ReduceOp::Sum, comm::Algorithm::Ring);
      const std::vector<double> v = sums.to_vector<double>();
      r.train_loss = v[1] > 0 ? v[0] / v[1] : 0.0;
      r.images_per_sec = r.train_seconds > 0 ? v[1] / r.train_seconds : 0.0;
    }
    if (rank == 0) evaluate(*model, *test_source, device, r);
    results.push_back(r);
    if (rank == 0 && !o.checkpoint.empty()) {
      apps::TrainCheckpoint meta;
      meta.epoch = epoch + 1;
      meta.model = o.model;
      meta.optimizer = o.optimizer;
      meta.seed = o.seed;
      meta.generator_offset = default_generator().offset();
      meta.lr = opt->lr();
      meta.test_accuracy = r.test_accuracy;
      apps::write_train_checkpoint(o.checkpoint, *model, *opt, meta);
    }
    if (print) {
      std::printf("epoch %2d/%d  train loss %.4f  test loss %.4f  test acc %.2f%%  %.0f img/s  "
                  "%.1f s (train %.1f s, eval %.1f s)\n",
                  epoch + 1, o.epochs, r.train_loss, r.test_loss, 100.0 * r.test_accuracy,
                  r.images_per_sec, seconds_since(epoch_start), r.train_seconds, r.eval_seconds);
      std::fflush(stdout);
    }
  }

  // The end of distributed training: the asynchronous workers pull the final parameters once
  // every worker's last gradient is in (a pull = a zero gradient at learning rate 0, which
  // leaves every optimizer's parameters unchanged); the synchronous servers are released; and
  // every worker compares its weights with rank 0's, bit for bit.
  bool replicas_equal = true;
  if (dist) {
    if (ps) {
      communicator->barrier();
      std::vector<float> zeros(ps_params.size(), 0.0f);
      ps->push_pull(zeros.data(), ps_params.data(), 0.0);
      comm::unflatten_from_host(ps_params, params);
      ps->finish();
    } else if (servers > 0) {
      comm::ps_shutdown(*t, po);
    }
    std::vector<Tensor> state = params;
    for (auto& [name, b] : model->named_buffers()) state.push_back(b);
    const std::vector<float> mine = comm::flatten_to_host(state);
    Tensor root =
        Tensor::from_vector<float>(mine, {static_cast<int64_t>(mine.size())}, t->device());
    communicator->broadcast(root, 0);
    const std::vector<float> theirs = root.to_vector<float>();
    int64_t differ = 0;
    double max_diff = 0;
    for (size_t i = 0; i < mine.size(); ++i) {
      if (std::memcmp(&mine[i], &theirs[i], sizeof(float)) != 0) {
        ++differ;
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(mine[i]) - theirs[i]));
      }
    }
    Tensor bad = Tensor::from_vector<double>({differ > 0 ? 1.0 : 0.0}, {1}, t->device());
    communicator->allreduce(bad, comm::ReduceOp::Sum, comm::Algorithm::Ring);
    replicas_equal = bad.to_vector<double>()[0] == 0;
    if (differ == 0) {
      if (!o.quiet) std::printf("rank %d: weights equal rank 0's\n", rank);
    } else {
      std::printf("rank %d: weights DIFFER from rank 0's in %lld of %zu values (max |diff| %g)\n",
                  rank, static_cast<long long>(differ), mine.size(), max_diff);
    }
    std::fflush(stdout);
  }
  if (rank != 0) return replicas_equal ? 0 : 1;

  // The summary (rank 0). Epoch seconds include evaluation; images/s counts the training loop
  // only, all ranks' images together.
  nlohmann::json j;
  std::vector<double> acc, loss, ips, secs;
  double train_total = 0, wait_total = 0;
  for (const EpochResult& r : results) {
    acc.push_back(r.test_accuracy);
    loss.push_back(r.train_loss);
    ips.push_back(r.images_per_sec);
    secs.push_back(r.train_seconds + r.eval_seconds);
    train_total += r.train_seconds;
    wait_total += r.wait_seconds;
  }
  const double final_acc = acc.empty() ? 0.0 : acc.back();
  j["device"] = device.str();
  j["model"] = o.model;
  j["optimizer"] = o.optimizer;
  j["lr"] = o.lr;
  j["gamma"] = o.gamma;
  j["epochs"] = o.epochs;
  j["start_epoch"] = start_epoch;
  j["batch_size"] = o.batch_size;
  j["eval_batch_size"] = o.eval_batch_size;
  j["threads"] = o.threads;
  j["kernels"] = impl_name(impl_for(device));
  j["train_images"] = train_set.size();
  j["test_images"] = test_set.size();
  j["test_accuracy"] = final_acc;
  j["test_accuracy_per_epoch"] = acc;
  j["train_loss_per_epoch"] = loss;
  j["train_images_per_sec"] = apps::median(ips);
  j["train_images_per_sec_per_epoch"] = ips;
  j["epoch_seconds"] = secs;
  // Tensor memory of the training device (the caching allocator's high-water mark).
  const MemoryStats mem = device_memory_stats(device);
  j["peak_memory_bytes"] = mem.peak_bytes;
  j["reserved_memory_bytes"] = mem.reserved_bytes;
  j["peak_rss_bytes"] = peak_rss_bytes();
  // Of the training loop's time, the fraction next() spent waiting for (or, with 0 workers,
  // building) batches: near 0 when the loader keeps up.
  j["loader_wait_fraction"] = train_total > 0 ? wait_total / train_total : 0.0;
  j["workers"] = o.workers;
  j["prefetch"] = o.prefetch;
  j["pin_memory"] = o.pin_memory;
  j["format"] = o.format;
  j["seed"] = o.seed;
  j["simulated"] = kSimulated && device.is_cuda();
  // Data parallelism (world_size 1 and zeros for --dist none).
  j["dist"] = o.dist;
  j["world_size"] = world;
  j["worker_ranks"] = workers;
  j["allreduce"] = dist ? o.allreduce : "none";
  j["ps_servers"] = servers;
  j["ps_async"] = o.ps_async;
  j["ps_staleness"] = o.ps_async ? o.ps_staleness : 0;
  j["bucket_mb"] = o.bucket_mb;
  j["fp16_allreduce"] = o.fp16_allreduce;
  j["batch_per_rank"] = o.batch_per_rank;
  j["rank_batch_size"] = rank_batch;
  j["global_batch_size"] = global_batch;
  j["warmup_steps"] = o.batch_per_rank ? warmup_steps : 0;
  // Gradient communication of rank 0: the allreduces' time on the communicator's thread, the
  // part of it backward did not hide, and the bytes this rank sent (async: pushes and pulls).
  const comm::DataParallelStats st = dp ? dp->stats() : comm::DataParallelStats();
  j["comm_seconds"] = dp ? st.comm_seconds : ps_seconds;
  j["exposed_comm_seconds"] = dp ? st.exposed_seconds : ps_seconds;
  j["overlap_fraction"] = st.overlap_fraction();
  j["bytes_sent_per_rank"] = dp ? st.bytes_sent : (dist ? t->bytes_sent() : 0);
  j["buckets"] = dp ? dp->num_buckets() : 0;
  j["replicas_equal"] = replicas_equal;
  if (!o.json.empty()) write_json(o.json, j);
  if (print) {
    std::printf("test accuracy %.2f%% after %d epochs; median %.0f img/s; peak RSS %.0f MB, "
                "tensors %.0f MB\n", 100.0 * final_acc, o.epochs, apps::median(ips),
                peak_rss_bytes() / 1e6, device_memory_stats(device).peak_bytes / 1e6);
    if (dist && !o.ps_async) {
      std::printf("communication: %.2f s of allreduce, %.0f%% hidden behind backward, %.1f MB "
                  "sent by rank 0\n", st.comm_seconds, 100.0 * st.overlap_fraction(),
                  static_cast<double>(st.bytes_sent) / 1e6);
    }
  }
  if (!replicas_equal) {
    std::fprintf(stderr, "mnist_train: error: the replicas diverged: some rank's weights differ "
                 "from rank 0's after training (see the lines above); this is a bug in the "
                 "data-parallel code\n");
    return 1;
  }
  return 0;
}

// Where Open MPI tells a process its rank before MPI is initialised (only rank 0 prints
// usage errors found before the transport exists).
bool launched_as_nonzero_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::atoi(v) != 0) return true;
  }
  return false;
}

int run(Options o, const CLI::App& app) {
  const DistSpec d = parse_dist(o.dist);
  check_dist_flags(o, app, d);
  if (d.kind == "local") check_world(o, d.ranks);
  check_output_path(o.json, "--json");
  check_output_path(o.checkpoint, "--checkpoint");
  const Device device = d.kind == "nccl" ? Device() : resolve_device(o.device);
  if (!o.kernels.empty()) set_kernel_impl(parse_impl(o.kernels.c_str()));
  if (kSimulated && device.is_cuda() && impl_for(device) == Impl::Vendor) {
    throw Error("--kernels vendor: cuBLAS/cuDNN are not available in the CUDA simulator; use "
                "--kernels hand (the simulator's default)", ErrorKind::Usage);
  }
  if (o.lr == 0) o.lr = o.optimizer == "sgd" ? 0.01 : o.optimizer == "adam" ? 1e-3 : 1.0;

  // Resuming: the checkpoint decides the seed and the epoch to start from.
  apps::TrainCheckpoint resumed;
  if (!o.resume.empty()) {
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
  }

  if (d.kind == "none") return train_rank(o, app, device, resumed, nullptr);
  if (d.kind == "local") {
    // Every rank a thread with its own model, generator and thread budget; when one fails,
    // run_local fails the others and rethrows its error.
    std::atomic<int> rc{0};
    comm::run_local(d.ranks, [&](std::shared_ptr<comm::Transport> t) {
      const int r = train_rank(o, app, device, resumed, t);
      int prev = rc.load();
      while (r > prev && !rc.compare_exchange_weak(prev, r)) {
      }
    });
    return rc.load();
  }
  // mpi / nccl: one rank per process.
  std::shared_ptr<comm::Transport> t = comm::make_transport(d.kind);
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints --help, or the error and a hint
    return rc == 0 ? 0 : 2;
  }
  // Under mpirun every rank finds the same bad flag: rank 0 alone says so.
  const bool say = !launched_as_nonzero_rank();
  try {
    return run(o, app);
  } catch (const Error& e) {
    std::fflush(stdout);
    if (say) std::fprintf(stderr, "mnist_train: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    if (say) std::fprintf(stderr, "mnist_train: error: %s\n", e.what());
    return 1;
  }
}
