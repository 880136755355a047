// options.h: what mnist_train's flags hold, with the defaults and why they were chosen.
//
// mnist_train.cpp declares the flags (add_flags) and fills one Options; every other file of
// apps/mnist/ reads it. A default chosen by measuring says why here and names the doc that holds
// the measurement and the command that reproduces it.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::apps::mnist {

// The default epoch count: the smallest that stays >= 99.0% test accuracy with every other
// flag at its default. More epochs buy no margin: StepLR's rates (x0.7 per epoch) add up to at
// most 3.3 epochs at the first one's, so by 6 the curve has flattened (the accuracies per epoch
// and seed: docs/training_recipes.md, "Does it cut the epochs by 10x?").
constexpr int kDefaultEpochs = 6;

// The default number of loader worker threads: 1. For MNIST on 2 cores 0, 1 or 2 workers cost
// the training loop under 1% (docs/data_loading.md, "mnist_train's default: one worker"), so
// the default serves the other cases: one worker takes batch building (PNG decoding with
// --format imagefolder) off the training thread, which matters on a GPU, where a step is
// milliseconds, without adding a third busy thread to two cores. (With --dist,
// share_host_between_ranks in dist_training.cpp may lower it to 0.)
constexpr int kDefaultWorkers = 1;

// The default gradient bucket: 1 MiB, not DataParallel's 25 MiB. The MNIST CNN's gradients are
// 4.8 MB, 98% of them fc1's weight, so with 25 MiB they travel as ONE bucket, launched when
// backward is over: nothing overlaps. With 1 MiB fc1's weight goes alone as soon as backward
// has produced it, while conv2's backward (most of the work) runs (the overlap and the speed,
// measured: docs/data_parallel.md, "mnist_train's bucket: 1 MiB").
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
  // Learning-rate schedule (apps/mnist/schedule.h): step (StepLR per epoch, the default) |
  // cosine | onecycle | cyclic (those three per optimizer step), and their parameters.
  std::string lr_schedule = "step";
  double pct_start = 0.3;           // onecycle: fraction of the steps spent rising
  double div_factor = 25;           // onecycle: initial lr = --lr / div_factor
  double final_div_factor = 1e4;    // onecycle: final lr = initial lr / final_div_factor
  std::string anneal = "cos";       // onecycle: cos | linear
  double base_lr = 0;               // cyclic: the low end (0: --lr / 4)
  double half_cycle_epochs = 1;     // cyclic: epochs from base_lr up to --lr (and as many down)
  std::string cyclic_mode = "triangular";  // cyclic: triangular | triangular2
  std::string recipe = "default";   // default | fast (apps/mnist/schedule.h)
  std::string optimizer = "adadelta";
  std::string precision = "fp32";  // fp32 | tf32 | bf16 | fp16 (apps/common/mixed_precision.h)
  // resnet18 only: images and activations contiguous (NCHW) | channels_last (NHWC), and what
  // flows between layers under bf16 / fp16: 16bit | f32 (empty: 16bit for resnet18, f32 for
  // the others, whose dropout takes f32 only).
  std::string memory_format = "contiguous";
  std::string activations;
  int threads = 1;
  uint64_t seed = 1;
  std::string data;
  int64_t limit_train = -1, limit_test = -1;
  std::string checkpoint, resume, json;
  int64_t checkpoint_every = 0;  // --checkpoint every N optimizer steps too (0: epoch ends only)
  std::string trace;  // Chrome trace JSON of the run (empty: tracing off)
  bool quiet = false;
  std::string kernels;
  int workers = kDefaultWorkers;
  int prefetch = 2;
  bool pin_memory = false;
  std::string format = "idx";
  // The whole data set in GPU memory, each batch gathered there by a kernel (data/device_mnist.h).
  bool data_on_device = false;
  // The training step, forward to update, replayed as one CUDA graph (engine/step_graph.h).
  // Off by default: apps/mnist/device.h says why.
  bool cuda_graph = false;
  // Data parallelism.
  std::string dist = "none";
  std::string allreduce = "ring";
  int ps_servers = 0;
  bool ps_async = false;
  int ps_staleness = 2;
  double bucket_mb = kDefaultBucketMb;
  bool fp16_allreduce = false;  // gradients as f16 on the wire
  bool bf16_allreduce = false;  // gradients as bf16 on the wire
  bool no_bucket_view = false;  // copy gradients into the buckets instead of viewing them
  bool batch_per_rank = false;
  double warmup_epochs = -1;  // -1: not given (1 with --batch-per-rank)
};

}  // namespace kiln::apps::mnist
