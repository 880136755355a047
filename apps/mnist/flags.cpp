// flags.cpp: mnist_train's flags and the checks on them (flags.h).
#include "apps/mnist/flags.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/common/data_paths.h"
#include "apps/common/flag_checks.h"
#include "apps/common/mixed_precision.h"
#include "apps/common/output_paths.h"
#include "data/mnist.h"
#include "engine/error.h"
#include "engine/parallel.h"
#include "engine/step_graph.h"

namespace kiln::apps::mnist {

namespace {


}  // namespace

void add_flags(CLI::App& app, Options& o) {
  app.add_option("--device", o.device, "auto | cpu | cpu:N | cuda | cuda:N (auto: a GPU if this "
                 "build has a CUDA backend and one is present, else the CPU)")->capture_default_str();
  app.add_option("--model", o.model, "cnn (the MNIST CNN, 1.2 M parameters) | mlp (784-512-256-10) "
                 "| resnet18 (torchvision's ResNet-18 on 1-channel images, 10 classes, 11.2 M "
                 "parameters; default recipe SGD + one-cycle to 0.05, 2 epochs)")
      ->check(apps::one_of({"cnn", "mlp", "resnet18"}))->capture_default_str();
  app.add_option("--epochs", o.epochs, "total number of epochs (a resumed run continues up to it)")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "training batch size")
      ->check(apps::at_least(int64_t{1}))->capture_default_str();
  app.add_option("--eval-batch-size", o.eval_batch_size, "evaluation batch size (larger is faster; "
                 "smaller needs less memory)")
      ->check(apps::at_least(int64_t{1}))->capture_default_str();
  app.add_option("--lr", o.lr, "base learning rate (default: adadelta 1.0, sgd 0.01, adam 0.001)")
      ->check(apps::above(0.0));
  app.add_option("--gamma", o.gamma, "StepLR factor applied to the learning rate after each epoch")
      ->check(apps::in_range(0.0, 1.0))->capture_default_str();
  app.add_option("--lr-schedule", o.lr_schedule, "step (x --gamma per epoch) | cosine (to 0 over "
                 "the run) | onecycle (Smith and Topin: up to --lr, then down) | cyclic (Smith: "
                 "triangles between --base-lr and --lr); all but step change the rate every "
                 "optimizer step")
      ->check(apps::one_of({"step", "cosine", "onecycle", "cyclic"}))->capture_default_str();
  app.add_option("--pct-start", o.pct_start, "onecycle: fraction of the steps spent rising to --lr")
      ->check(apps::in_range(0.01, 0.99))->capture_default_str();
  app.add_option("--div-factor", o.div_factor, "onecycle: the run starts at --lr / this")
      ->check(apps::in_range(1.0, 1e9))->capture_default_str();
  app.add_option("--final-div-factor", o.final_div_factor, "onecycle: the run ends at --lr / "
                 "--div-factor / this")->check(apps::in_range(1.0, 1e12))->capture_default_str();
  app.add_option("--anneal", o.anneal, "onecycle: how the rate falls: cos | linear")
      ->check(apps::one_of({"cos", "linear"}))->capture_default_str();
  app.add_option("--base-lr", o.base_lr, "cyclic: the bottom of the cycle (default --lr / 4)")
      ->check(apps::above(0.0));
  app.add_option("--half-cycle-epochs", o.half_cycle_epochs, "cyclic: epochs from --base-lr up "
                 "to --lr (and as many back down)")->check(apps::above(0.0))
      ->capture_default_str();
  app.add_option("--cyclic-mode", o.cyclic_mode, "cyclic: triangular | triangular2 (the height "
                 "halves every cycle)")
      ->check(apps::one_of({"triangular", "triangular2"}))->capture_default_str();
  app.add_option("--recipe", o.recipe, "default (the flags' defaults: Adadelta + StepLR, 6 "
                 "epochs) | fast (Adam + one-cycle, fewer epochs: apps/mnist/schedule.h); flags "
                 "given explicitly override the recipe's values")
      ->check(apps::one_of({"default", "fast"}))->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adadelta | sgd (momentum 0.9) | adam")
      ->check(apps::one_of({"adadelta", "sgd", "adam"}))->capture_default_str();
  app.add_option("--precision", o.precision, apps::kPrecisionHelp)
      ->check(apps::one_of({"fp32", "tf32", "bf16", "fp16"}))->capture_default_str();
  app.add_option("--memory-format", o.memory_format, "resnet18: images and activations "
                 "contiguous (NCHW; channel-blocked on the CPU where that is faster) | "
                 "channels_last (NHWC)")
      ->check(apps::one_of({"contiguous", "channels_last"}))->capture_default_str();
  app.add_option("--activations", o.activations,
                 std::string(apps::kActivationsHelp) + " (default: 16bit for resnet18; cnn and "
                 "mlp take f32 only: the CNN's dropout does)")
      ->check(apps::one_of({"16bit", "f32"}));
  o.threads = hardware_threads();
  app.add_option("--threads", o.threads, "CPU threads (OpenMP, BLAS and oneDNN share them; default: "
                 "the cores this process may use; with --dist, divided by the ranks on this host)")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_option("--seed", o.seed, "seed of initialisation, dropout and shuffling")
      ->check(apps::any_unsigned<uint64_t>())->capture_default_str();
  o.data = apps::in_source_tree("datasets/mnist");
  app.add_option("--data", o.data, "directory holding the four MNIST IDX files (run "
                 "datasets/fetch_mnist.sh to get them), or with --format imagefolder the folders "
                 "train/<class>/*.png and test/<class>/*.png (apps/idx_to_imagefolder writes "
                 "them)")->capture_default_str();
  app.add_option("--format", o.format, "idx (the four MNIST files) | imagefolder (one PNG per "
                 "image: decoding them is real work for the loader's workers)")
      ->check(apps::one_of({"idx", "imagefolder"}))->capture_default_str();
  app.add_option("--workers", o.workers, "loader worker threads building batches ahead of the "
                 "training loop (0: build each batch in the loop itself; with --dist the "
                 "default is 0 when the ranks' threads already fill this host's cores)")
      ->check(apps::at_least(0))->capture_default_str();
  app.add_option("--prefetch", o.prefetch, "batches the loader builds ahead, at most")
      ->check(apps::at_least(1))->capture_default_str();
  app.add_flag("--pin-memory", o.pin_memory, "stage batches in page-locked host memory (always "
               "on when training on a GPU; needs a build with CUDA)");
  app.add_flag("--data-on-device", o.data_on_device, "copy the whole training and test sets "
               "to the GPU once (as bytes: 47 MB for MNIST) and gather each batch there with a "
               "kernel, instead of the loader's threads and a copy per batch: the same batches, "
               "bit for bit (needs a CUDA --device, --dist none and --format idx)");
  app.add_flag("--cuda-graph", o.cuda_graph, "run each training step (forward, loss, backward, "
               "update) as one CUDA graph: " + std::to_string(StepGraphOptions().warmup_steps) +
               " eager steps, one capture, then one launch per step instead of hundreds; the "
               "same results bit for bit (an epoch's last, smaller batch runs eagerly). Off by "
               "default: --trace then shows one span per step, not its phases (needs a CUDA "
               "--device and --dist none)");
  app.add_option("--limit-train", o.limit_train, "train on the first N training images only "
                 "(imagefolder: N images spread evenly over the classes)")
      ->check(apps::at_least(int64_t{1}));
  app.add_option("--limit-test", o.limit_test, "evaluate on the first N test images only "
                 "(imagefolder: spread evenly)")
      ->check(apps::at_least(int64_t{1}));
  app.add_option("--checkpoint", o.checkpoint, "save model + optimizer + RNG state here after each epoch");
  app.add_option("--checkpoint-every", o.checkpoint_every, "also save --checkpoint every N "
                 "optimizer steps inside an epoch, with the epoch's position, so a killed run "
                 "resumes at the batch it had reached (0: at epoch ends only)")
      ->check(apps::at_least(int64_t{0}))->capture_default_str();
  app.add_option("--resume", o.resume, "continue a run from this checkpoint, at the epoch and "
                 "batch it was written at (same flags, threads and ranks give the same result, "
                 "bit for bit, as an uninterrupted run; another --dist rank count continues "
                 "with the epoch's remaining examples dealt out among the new ranks)");
  app.add_option("--json", o.json, "write a JSON summary of the run here");
  app.add_option("--trace", o.trace, "record a timeline of the run (loader waits, batch copies "
                 "to the GPU, forward, backward, optimizer steps, gradient allreduce buckets) and "
                 "write it here as Chrome trace JSON (open in ui.perfetto.dev; tools/plot.py "
                 "--trace draws a Gantt chart); with one rank per process (--dist mpi, nccl) "
                 "rank r > 0 writes PATH with .rank<r> before the extension");
  app.add_flag("--quiet,-q", o.quiet, "print nothing but errors (the JSON summary is still written)");
  app.add_option("--dist", o.dist, "none | local:N (N data-parallel ranks as threads of this "
                 "process) | mpi (one rank per process: launch with mpirun -np N) | nccl (one "
                 "rank per GPU, under mpirun) | nccl:N (N ranks as threads of this process on "
                 "cuda:0..N-1; the form the CUDA simulator runs)")->capture_default_str();
  app.add_option("--allreduce", o.allreduce, "how gradients are averaged: ring | hd "
                 "(halving-doubling) | bb (binary blocks) | ps (parameter server) | native (MPI_Allreduce / "
                 "ncclAllReduce; mpi and nccl only)")
      ->check(apps::one_of({"ring", "hd", "bb", "ps", "native"}))->capture_default_str();
  app.add_option("--ps-servers", o.ps_servers, "with --allreduce ps: dedicated server ranks, the "
                 "last S ranks (0: one shard on every worker rank)")
      ->check(apps::at_least(0))->capture_default_str();
  app.add_flag("--ps-async", o.ps_async, "asynchronous parameter server: workers push gradients "
               "and pull parameters without a global barrier (needs --allreduce ps and "
               "--ps-servers >= 1)");
  app.add_option("--ps-staleness", o.ps_staleness, "with --ps-async: how many steps a worker may "
                 "run ahead of the slowest one")
      ->check(apps::at_least(0))->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "gradient fusion bucket size in MiB (the allreduce "
                 "of a full bucket starts while backward goes on)")
      ->check(apps::above(0.0))->capture_default_str();
  app.add_flag("--fp16-allreduce", o.fp16_allreduce, "send gradients as IEEE half (half the bytes "
               "on the wire; values above 65504 become inf)");
  app.add_flag("--bf16-allreduce", o.bf16_allreduce, "send gradients as bfloat16 (half the bytes "
               "on the wire, f32's range, 8 bits of precision)");
  app.add_flag("--no-bucket-view", o.no_bucket_view, "copy gradients into the allreduce buckets "
               "and back instead of letting each .grad be a view into its bucket");
  app.add_flag("--batch-per-rank", o.batch_per_rank, "Horovod's recipe: --batch-size is per worker "
               "rank (the global batch grows with the ranks) and the learning rate is multiplied "
               "by the number of workers after a linear warm-up (--warmup-epochs)");
  app.add_option("--warmup-epochs", o.warmup_epochs, "with --batch-per-rank: epochs of linear "
                 "learning-rate warm-up from --lr to --lr x workers (default 1)")
      ->check(apps::at_least(0.0));
  app.add_option("--kernels", o.kernels,
                 "hand (our kernels: im2col + GEMM) | vendor (oneDNN on "
                 "the CPU, cuBLAS/cuDNN on a GPU); default: $KILN_KERNELS or vendor")
      ->check(apps::one_of({"hand", "vendor"}));
}

void check_model_flags(const Options& o, const CLI::App& app) {
  if (o.model == "resnet18") return;
  if (app.count("--memory-format") > 0) {
    throw Error("--memory-format applies to --model resnet18 (the " + o.model + "'s "
                "activations are NCHW): drop it or pass --model resnet18", ErrorKind::Usage);
  }
  if (o.activations == "16bit") {
    throw Error("--activations 16bit applies to --model resnet18 (the " + o.model + " takes f32 "
                "activations: the CNN's dropout takes f32 only): drop it or pass --model "
                "resnet18", ErrorKind::Usage);
  }
}

std::string activations_of(const Options& o) {
  if (!o.activations.empty()) return o.activations;
  return o.model == "resnet18" ? "16bit" : "f32";
}

void check_output_flags(const Options& o) {
  std::vector<apps::InputPath> inputs = {{"--resume", o.resume, "--checkpoint"}};
  if (o.format == "idx") {
    for (MnistSplit split : {MnistSplit::Train, MnistSplit::Test}) {
      for (const std::string& name :
           {MnistDataset::images_file_name(split), MnistDataset::labels_file_name(split)}) {
        inputs.push_back({"--data", (std::filesystem::path(o.data) / name).string()});
      }
    }
  }
  apps::check_output_paths({{"--json", o.json}, {"--checkpoint", o.checkpoint},
                            {"--trace", o.trace}},
                           inputs);
}

// A batch the loaders could never hold is bad input, refused before anything is allocated
// (each loader keeps a few batches of 28x28 f32 images; the activations come on top).
void check_batch_sizes_fit(const Options& o) {
  constexpr double kImageBytes = 28 * 28 * sizeof(float);
  apps::check_fits_in_memory("--batch-size", std::to_string(o.batch_size),
                             o.batch_size * kImageBytes, "one batch of 28x28 f32 images");
  apps::check_fits_in_memory("--eval-batch-size", std::to_string(o.eval_batch_size),
                             o.eval_batch_size * kImageBytes, "one batch of 28x28 f32 images");
}

// --checkpoint-every needs a file to write, and a run whose whole state the worker ranks hold:
// with --ps-async the optimizer state lives on the server ranks, which save nothing.
void check_checkpoint_flags(const Options& o) {
  if (o.checkpoint_every > 0 && o.checkpoint.empty()) {
    throw Error("--checkpoint-every " + std::to_string(o.checkpoint_every) + " needs "
                "--checkpoint FILE to write to", ErrorKind::Usage);
  }
  if (o.checkpoint_every > 0 && o.ps_async) {
    throw Error("--checkpoint-every cannot be combined with --ps-async: the server ranks hold "
                "the optimizer state, which no checkpoint saves; drop one of them",
                ErrorKind::Usage);
  }
}

}  // namespace kiln::apps::mnist
