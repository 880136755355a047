// bad_invocations_test: every app's flags, bad and good, as one table of
// {app, argv, expected exit code, expected text in stderr}.
//
// The exit codes of every Kiln app: 0 ok (and --help), 2 bad usage or bad input, 1 a runtime
// failure. A bad row must fail before any work (each runs in milliseconds); a good row uses tiny
// sizes. The stderr text checks that the message names the flag and the value in words, not
// CLI11's raw validator text ("Value 0 not in range 0.000000 to 1797...").
//
// The apps' paths come from CMake (KILN_APP_<NAME>); rows marked kNeedsMnist skip without real
// MNIST in datasets/mnist (datasets/fetch_mnist.sh).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "support/run_command.h"

namespace {

enum class Data { kNone, kNeedsMnist };

struct Row {
  const char* app;                // an app target's name
  std::vector<std::string> args;  // its flags
  int exit_code;                  // expected
  const char* stderr_has;         // expected substring of stderr ("" for none)
  Data data = Data::kNone;
  std::vector<std::string> env = {};  // VAR=value set for the app alone (a launcher's variables)
};

std::string app_path(const std::string& app) {
  if (app == "mnist_train") return KILN_APP_MNIST_TRAIN;
  if (app == "resnet_bench") return KILN_APP_RESNET_BENCH;
  if (app == "comm_bench") return KILN_APP_COMM_BENCH;
  if (app == "loader_bench") return KILN_APP_LOADER_BENCH;
  if (app == "train_step_bench") return KILN_APP_TRAIN_STEP_BENCH;
  if (app == "gemm_bench") return KILN_APP_GEMM_BENCH;
  if (app == "conv_bench") return KILN_APP_CONV_BENCH;
  if (app == "idx_to_imagefolder") return KILN_APP_IDX_TO_IMAGEFOLDER;
  if (app == "train_mnist_minimal") return KILN_APP_TRAIN_MNIST_MINIMAL;
  if (app == "checkpoint_tool") return KILN_APP_CHECKPOINT_TOOL;
  return "";
}

const std::string kMnist = std::string(KILN_SOURCE_DIR) + "/datasets/mnist";
const std::string kScratch = ::testing::TempDir() + "kiln_bad_invocations_out";

// ---- output paths: fixtures ----
// Things an output must never replace, made when the table is built, in a folder of this
// process's own (a row that failed in another run, or another build tree's run, cannot have
// replaced them), removed at exit: a regular file "file" and its hard link "link", a FIFO
// "fifo", a directory "dir", and "data/train-images-idx3-ubyte", an input of the apps that
// read MNIST.
struct OutFixtures {
  std::string dir = ::testing::TempDir() + "kiln_bad_invocations_paths_" +
                    std::to_string(::getpid());
  OutFixtures() {
    std::filesystem::create_directories(dir + "/dir");
    std::filesystem::create_directories(dir + "/data");
    std::ofstream(dir + "/file") << "old\n";
    std::ofstream(dir + "/data/train-images-idx3-ubyte") << "stands for an IDX file\n";
    std::filesystem::create_hard_link(dir + "/file", dir + "/link");
    ::mkfifo((dir + "/fifo").c_str(), 0644);
  }
  ~OutFixtures() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

std::string out_fixture(const std::string& name) {
  static const OutFixtures fixtures;
  return fixtures.dir + "/" + name;
}

// ---- data: fixtures ----
// Small bad datasets in their own folder (kiln_bad_invocations_data), made on first use. Each
// file is written under a temporary name and renamed, so that test processes running at once
// never read a half-written one.
void write_atomically(const std::string& path, const std::string& bytes) {
  if (std::filesystem::exists(path)) return;
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  std::ofstream(tmp, std::ios::binary) << bytes;
  std::filesystem::rename(tmp, path);
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// MNIST's four IDX files with `train` and `test` images (all 0, label 0) in `dir`.
void write_idx(const std::string& dir, uint32_t train, uint32_t test) {
  std::filesystem::create_directories(dir);
  for (const auto& [prefix, n] : {std::pair<std::string, uint32_t>{"train", train}, {"t10k", test}}) {
    write_atomically(dir + "/" + prefix + "-images-idx3-ubyte",
                     be32(2051) + be32(n) + be32(28) + be32(28) + std::string(n * 784, '\0'));
    write_atomically(dir + "/" + prefix + "-labels-idx1-ubyte", be32(2049) + be32(n) + std::string(n, '\0'));
  }
}

// A 1x1 grey PNG (valid CRCs and Adler-32); `damaged`: the last byte of IDAT's CRC changed.
std::string tiny_png(bool damaged) {
  static const unsigned char png[67] = {
      0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
      0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0x00, 0x00, 0x00, 0x3a,
      0x7e, 0x9b, 0x55, 0x00, 0x00, 0x00, 0x0a, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x68,
      0x00, 0x00, 0x00, 0x82, 0x00, 0x81, 0x77, 0xcd, 0x72, 0xb6, 0x00, 0x00, 0x00, 0x00, 0x49,
      0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82};
  std::string s(reinterpret_cast<const char*>(png), sizeof png);
  if (damaged) s[54] = static_cast<char>(s[54] ^ 0x01);
  return s;
}

// DIR/<split>/<class>/0.png for each class of each split.
void write_image_folder(const std::string& dir, const std::vector<std::string>& train_classes,
                        const std::vector<std::string>& test_classes, bool damaged_train) {
  for (const auto& [split, classes] : {std::pair<std::string, const std::vector<std::string>*>{
                                           "train", &train_classes}, {"test", &test_classes}}) {
    for (const std::string& c : *classes) {
      std::filesystem::create_directories(dir + "/" + split + "/" + c);
      write_atomically(dir + "/" + split + "/" + c + "/0.png", tiny_png(damaged_train && split == "train"));
    }
  }
}

std::string data_fixture(const std::string& name) {
  static const std::string dir = [] {
    const std::string d = ::testing::TempDir() + "kiln_bad_invocations_data";
    write_idx(d + "/empty_train", 0, 2);
    write_idx(d + "/empty_test", 2, 0);
    write_idx(d + "/two", 2, 2);
    const std::vector<std::string> digits = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
    std::vector<std::string> other = digits;
    other.back() = "x";
    write_image_folder(d + "/classes", digits, other, false);
    write_image_folder(d + "/damaged", digits, digits, true);
    std::error_code ec;  // EEXIST: made already
    std::filesystem::create_directory_symlink(d + "/loop", d + "/loop", ec);
    return d;
  }();
  return dir + "/" + name;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = {
      // ---- mnist_train: ranges, choices, combinations, sizes ----
      {"mnist_train", {"--epochs", "0"}, 2, "--epochs must be at least 1 (got 0)"},
      {"mnist_train", {"--epochs", "2.5"}, 2, "--epochs must be a whole number, at least 1 (got 2.5)"},
      {"mnist_train", {"--epochs", "99999999999"}, 2, "--epochs must be at most 2147483647"},
      {"mnist_train", {"--batch-size", "0"}, 2, "--batch-size must be at least 1 (got 0)"},
      {"mnist_train", {"--eval-batch-size", "-3"}, 2, "--eval-batch-size must be at least 1 (got -3)"},
      {"mnist_train", {"--lr", "-1"}, 2, "--lr must be > 0 (got -1)"},
      {"mnist_train", {"--lr", "0"}, 2, "--lr must be > 0 (got 0)"},
      {"mnist_train", {"--lr", "abc"}, 2, "--lr must be a number, > 0 (got abc)"},
      {"mnist_train", {"--lr", "nan"}, 2, "--lr must be a number, > 0 (got nan)"},
      {"mnist_train", {"--gamma", "1.5"}, 2, "--gamma must be between 0 and 1 (got 1.5)"},
      {"mnist_train", {"--pct-start", "1"}, 2, "--pct-start must be between 0.01 and 0.99 (got 1)"},
      {"mnist_train", {"--div-factor", "0.5"}, 2, "--div-factor must be between 1 and"},
      {"mnist_train", {"--half-cycle-epochs", "0"}, 2, "--half-cycle-epochs must be > 0 (got 0)"},
      {"mnist_train", {"--threads", "0"}, 2, "--threads must be at least 1 (got 0)"},
      {"mnist_train", {"--workers", "-1"}, 2, "--workers must be at least 0 (got -1)"},
      {"mnist_train", {"--prefetch", "0"}, 2, "--prefetch must be at least 1 (got 0)"},
      {"mnist_train", {"--limit-train", "0"}, 2, "--limit-train must be at least 1 (got 0)"},
      {"mnist_train", {"--bucket-mb", "0"}, 2, "--bucket-mb must be > 0 (got 0)"},
      {"mnist_train", {"--warmup-epochs", "-1"}, 2, "--warmup-epochs must be at least 0 (got -1)"},
      {"mnist_train", {"--precision", "fp64"}, 2,
       "--precision must be one of fp32, tf32, bf16, fp16 (got fp64)"},
      {"mnist_train", {"--model", "resnet"}, 2, "--model must be one of cnn, mlp, resnet18 (got resnet)"},
      {"mnist_train", {"--memory-format", "nhwc"}, 2,
       "--memory-format must be one of contiguous, channels_last (got nhwc)"},
      {"mnist_train", {"--activations", "f8"}, 2, "--activations must be one of 16bit, f32 (got f8)"},
      {"mnist_train", {"--optimizer", "lamb"}, 2, "--optimizer must be one of adadelta, sgd, adam (got lamb)"},
      {"mnist_train", {"--lr-schedule", "linear"}, 2, "--lr-schedule must be one of step, cosine"},
      {"mnist_train", {"--allreduce", "tree"}, 2, "--allreduce must be one of ring, hd, bb, ps, native"},
      {"mnist_train", {"--kernels", "fast"}, 2, "--kernels must be one of hand, vendor (got fast)"},
      {"mnist_train", {"--dist", "local:0"}, 2, "--dist local:0: use none, local:N"},
      {"mnist_train", {"--ps-async"}, 2, "--ps-async needs --allreduce ps and --ps-servers >= 1"},
      {"mnist_train", {"--dist", "local:2", "--ps-servers", "1"}, 2, "--ps-servers 1 needs --allreduce ps"},
      {"mnist_train", {"--dist", "local:2", "--ps-staleness", "3"}, 2, "--ps-staleness applies to the asynchronous"},
      {"mnist_train", {"--warmup-epochs", "1"}, 2, "--warmup-epochs belongs to the large-minibatch recipe"},
      {"mnist_train", {"--dist", "local:2", "--allreduce", "native"}, 2, "--allreduce native is MPI_Allreduce"},
      {"mnist_train", {"--dist", "local:2", "--fp16-allreduce", "--bf16-allreduce"}, 2,
       "--fp16-allreduce and --bf16-allreduce each choose"},
      {"mnist_train", {"--allreduce", "hd"}, 2, "need several ranks: add --dist local:N"},
      {"mnist_train", {"--dist", "local:3", "--batch-size", "128"}, 2,
       "--batch-size 128 is the global batch and must split evenly over the 3 worker ranks"},
      {"mnist_train", {"--dist", "local:2", "--allreduce", "ps", "--ps-servers", "2"}, 2,
       "--ps-servers 2 leaves no worker among 2 ranks"},
      {"mnist_train", {"--batch-size", "100000000"}, 2,
       "--batch-size 100000000: one batch of 28x28 f32 images would need"},
      {"mnist_train", {"--eval-batch-size", "100000000000"}, 2, "lower --eval-batch-size"},
      {"mnist_train", {"--json", "/nonexistent-kiln-dir/run.json"}, 2, "does not exist: create it first"},
      {"mnist_train", {"--no-such-flag"}, 2, "--no-such-flag"},
      {"mnist_train", {"--no-such-flag"}, 2, "Run mnist_train --help"},
      {"mnist_train", {"--epochs"}, 2, "--epochs"},
      {"mnist_train", {"--help"}, 0, ""},
      {"mnist_train",
       {"--epochs", "1", "--limit-train", "64", "--limit-test", "64", "--batch-size", "32",
        "--threads", "1", "--workers", "0", "--quiet"},
       0, "", Data::kNeedsMnist},

      // ---- resnet_bench ----
      {"resnet_bench", {"--image-size", "16"}, 2, "--image-size must be between 32 and 4096 (got 16)"},
      {"resnet_bench", {"--batch-size", "0"}, 2, "--batch-size must be between 1 and 65536 (got 0)"},
      {"resnet_bench", {"--width", "4"}, 2, "--width must be between 8 and 64 (got 4)"},
      {"resnet_bench", {"--cuda-graph", "--devices", "cpu:0,cpu:1"}, 2,
       "--cuda-graph times the single-device step as a CUDA graph"},
      {"resnet_bench", {"--lr", "0"}, 2, "--lr must be > 0 (got 0)"},
      {"resnet_bench", {"--dp", "65"}, 2, "--dp must be between 1 and 64 (got 65)"},
      {"resnet_bench", {"--model", "resnet19"}, 2, "--model must be one of resnet18, resnet34"},
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--schedule", "gpipe,zb"}, 2,
       "--schedule: each must be one of gpipe, 1f1b, zb-h1, zb-h2, interleaved (got zb"},
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--schedule", "naive"}, 2,
       "the naive schedule is --modes model-parallel"},
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--schedule", ","}, 2,
       "--schedule \",\" names no schedule"},
      {"resnet_bench", {"--chunks", "0"}, 2, "--chunks must be between 1 and 64 (got 0)"},
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--dp", "2", "--schedule", "gpipe,1f1b"}, 2,
       "--dp and mpirun run one pipeline schedule"},
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--model", "resnet18", "--schedule",
        "interleaved", "--chunks", "64"}, 2, "pieces (devices x --chunks) but resnet18 has only"},
      {"resnet_bench", {"--balance", "random"}, 2, "--balance must be one of time, params, tutorial"},
      {"resnet_bench", {"--refine-cut", "--balance", "tutorial"}, 2,
       "--refine-cut moves the cut, --balance tutorial keeps the tutorial's fixed one"},
      {"resnet_bench", {"--refine-cut", "--no-refine-cut"}, 2,
       "--refine-cut excludes --no-refine-cut"},
      {"resnet_bench", {"--refine-cut", "--dp", "2"}, 2,
       "--dp and mpirun run one pipeline at the time-balanced cut"},
      {"resnet_bench", {"--devices", "cpu:0"}, 2, "--devices"},
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--modes", "single,foo"}, 2,
       "--modes: each must be one of single, model-parallel, pipeline (got foo)"},
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--batch-size", "4", "--split-sizes", "0"}, 2,
       "--split-sizes: each must be a number of rows between 1 and --batch-size 4 (got 0)"},
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--precision", "fp16"}, 2,
       "--precision fp16 needs loss scaling"},
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--batch-size", "65536", "--image-size", "4096"},
       2, "--batch-size 65536: one batch of 3x4096x4096 f32 images (--image-size 4096) would need"},
      {"resnet_bench", {"--help"}, 0, ""},

      // ---- comm_bench ----
      {"comm_bench", {"--iters", "0"}, 2, "--iters must be at least 1 (got 0)"},
      {"comm_bench", {"--warmup", "-1"}, 2, "--warmup must be at least 0 (got -1)"},
      {"comm_bench", {"--max-seconds", "0"}, 2, "--max-seconds must be > 0 (got 0)"},
      {"comm_bench", {"--step-factor", "1"}, 2, "--step-factor must be between 2 and 1024 (got 1)"},
      {"comm_bench", {"--dtype", "f64"}, 2, "--dtype must be one of fp32, fp16, bf16 (got f64)"},
      {"comm_bench", {"--ps-scaling", "1,64"}, 2, "--ps-scaling must be between 1 and 63 (got 64)"},
      {"comm_bench", {"--ps-servers", "-1"}, 2, "--ps-servers must be at least 0 (got -1)"},
      {"comm_bench", {"--dist", "local:99"}, 2, "--dist local:99: expected local:N with N in 1..64"},
      {"comm_bench", {"--allreduce", "tree"}, 2, "tree"},
      {"comm_bench", {"--min-bytes", "4X"}, 2, "--min-bytes 4X: expected a positive size in bytes"},
      {"comm_bench", {"--min-bytes", "1M", "--max-bytes", "4K"}, 2, "--min-bytes 1M is larger than --max-bytes 4K"},
      {"comm_bench", {"--max-bytes", "99999999999G"}, 2, "--max-bytes 99999999999G: more bytes than any buffer can hold"},
      {"comm_bench", {"--dist", "local:4", "--max-bytes", "1000G"}, 2,
       "--max-bytes 1000G: a message on each of the 4 ranks of this process would need"},
      {"comm_bench", {"--ps-scaling", "2", "--ps-bytes", "1000G"}, 2, "lower --ps-bytes"},
      {"comm_bench", {"--append"}, 2, "--append adds rows to the --csv file: give --csv FILE"},
      {"comm_bench", {"--ps-scaling", "2", "--ps-servers", "1"}, 2,
       "--ps-scaling always runs one dedicated server: drop --ps-servers"},
      {"comm_bench", {"--help"}, 0, ""},
      {"comm_bench",
       {"--dist", "local:2", "--min-bytes", "4K", "--max-bytes", "4K", "--iters", "1",
        "--warmup", "0", "--allreduce", "ring"},
       0, ""},

      // ---- loader_bench ----
      {"loader_bench", {"--mode", "speed"}, 2, "--mode must be one of throughput, train, h2d (got speed)"},
      {"loader_bench", {"--format", "cifar"}, 2, "--format must be one of idx, imagefolder, synthetic"},
      {"loader_bench", {"--workers", "0,-2"}, 2, "--workers must be at least 0 (got -2)"},
      {"loader_bench", {"--batch-size", "0"}, 2, "--batch-size must be at least 1 (got 0)"},
      {"loader_bench", {"--prefetch", "0"}, 2, "--prefetch must be at least 1 (got 0)"},
      {"loader_bench", {"--h2d-max-mb", "0"}, 2, "--h2d-max-mb must be between 1 and 1048576 (got 0)"},
      {"loader_bench", {"--format", "synthetic", "--shape", "1,0,28"}, 2, "--shape 1,0,28: expected three positive sizes"},
      {"loader_bench", {"--format", "synthetic", "--batch-size", "100000000000"}, 2,
       "--batch-size 100000000000: one batch of f32 examples would need"},
      {"loader_bench", {"--mode", "h2d", "--h2d-max-mb", "1000000"}, 2, "lower --h2d-max-mb"},
      {"loader_bench", {"--format", "synthetic", "--append"}, 2, "--append adds rows to the --csv file"},
      {"loader_bench", {"--help"}, 0, ""},
      {"loader_bench",
       {"--format", "synthetic", "--synthetic-size", "64", "--batch-size", "8", "--batches", "2",
        "--warmup-batches", "0", "--repeats", "1", "--workers", "0,1"},
       0, ""},

      // ---- train_step_bench ----
      {"train_step_bench", {"--batch-size", "0"}, 2, "--batch-size must be between 1 and 1048576 (got 0)"},
      {"train_step_bench", {"--threads", "0"}, 2, "--threads must be between 1 and 1024 (got 0)"},
      {"train_step_bench", {"--steps", "0"}, 2, "--steps must be between 1 and 100000 (got 0)"},
      {"train_step_bench", {"--mode", "infer"}, 2, "--mode must be one of train, eval (got infer)"},
      {"train_step_bench", {"--precision", "fp64"}, 2, "--precision must be one of fp32, tf32, bf16, fp16 (got fp64)"},
      {"train_step_bench", {"--image-size", "64"}, 2, "--image-size applies to the ResNet models"},
      {"train_step_bench", {"--cuda-graph"}, 2, "--cuda-graph needs a CUDA device"},
      {"train_step_bench", {"--fold-bn"}, 2, "--fold-bn needs --mode eval and a ResNet model"},
      {"train_step_bench", {"--precision", "tf32"}, 2, "--precision tf32 needs a CUDA device"},
      {"train_step_bench", {"--model", "resnet18", "--batch-size", "1000000", "--image-size", "4096"},
       2, "lower --batch-size"},
      {"train_step_bench", {"--help"}, 0, ""},
      {"train_step_bench", {"--batch-size", "2", "--steps", "1", "--warmup", "0", "--threads", "1"}, 0, ""},

      // ---- gemm_bench ----
      {"gemm_bench", {"--sizes", "64,0"}, 2, "--sizes must be between 1 and 1048576 (got 0)"},
      {"gemm_bench", {"--iters", "0"}, 2, "--iters must be at least 1 (got 0)"},
      {"gemm_bench", {"--device", "tpu"}, 2, "--device must be one of cuda, cpu (got tpu)"},
      {"gemm_bench", {"--kernels", "fastest"}, 2, "--kernels must be one of naive, tiled"},
      {"gemm_bench", {"--precision", "f8"}, 2, "--precision must be one of bf16, fp16 (got f8)"},
      {"gemm_bench", {"--device", "cpu", "--kernels", "naive"}, 2, "--kernels naive is not a cpu kernel"},
      {"gemm_bench", {"--device", "cpu", "--sizes", "1000000"}, 2,
       "--sizes 1000000: three 1000000 x 1000000 f32 matrices would need"},
      {"gemm_bench", {"--help"}, 0, ""},
      {"gemm_bench", {"--device", "cpu", "--sizes", "8", "--iters", "1", "--warmup", "0", "--kernels", "blas"}, 0, ""},

      // ---- conv_bench ----
      {"conv_bench", {"--batch-size", "0"}, 2, "--batch-size must be at least 1 (got 0)"},
      {"conv_bench", {"--threads", "0"}, 2, "--threads must be at least 1 (got 0)"},
      {"conv_bench", {"--warmup", "-1"}, 2, "--warmup must be at least 0 (got -1)"},
      {"conv_bench", {"--shapes", "vgg"}, 2, "--shapes must be one of mnist, resnet50 (got vgg)"},
      {"conv_bench", {"--hand-kernel", "fft"}, 2, "--hand-kernel must be one of implicit-gemm, direct (got fft)"},
      {"conv_bench", {"--batch-size", "10000000000"}, 2, "lower --batch-size"},
      {"conv_bench", {"--help"}, 0, ""},

      // ---- idx_to_imagefolder ----
      {"idx_to_imagefolder", {}, 2, "--out is required"},
      {"idx_to_imagefolder", {"--out", kScratch, "--limit-train", "0"}, 2, "--limit-train 0 would write no image"},
      {"idx_to_imagefolder", {"--out", kScratch, "--limit-test", "-5"}, 2, "--limit-test must be at least -1 (got -5)"},
      {"idx_to_imagefolder", {"--out", kScratch, "--data", "/nonexistent-kiln-dir"}, 2, "/nonexistent-kiln-dir"},
      {"idx_to_imagefolder", {"--help"}, 0, ""},

      // ---- launches without --dist, values that slip through, train_mnist_minimal ----
      // Several processes from mpirun or srun and no --dist: each would train alone, all writing
      // the same files. One process (mpirun -np 1), an explicit --dist, and an sbatch script
      // (SLURM_NTASKS of the allocation, one process) pass on to the next check.
      {"mnist_train", {}, 2,
       "started as one of 2 processes (OMPI_COMM_WORLD_SIZE=2) without --dist: each process "
       "would run alone, all writing the same files; add --dist mpi",
       Data::kNone, {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0"}},
      {"mnist_train", {"--epochs", "1"}, 2, "(PMI_SIZE=4) without --dist", Data::kNone,
       {"PMI_SIZE=4", "PMI_RANK=0"}},
      {"mnist_train", {}, 2, "(SLURM_STEP_NUM_TASKS=3) without --dist", Data::kNone,
       {"SLURM_STEP_NUM_TASKS=3", "SLURM_NTASKS=3", "SLURM_PROCID=0"}},
      {"mnist_train", {"--batch-size", "100000000"}, 2, "--batch-size 100000000: one batch",
       Data::kNone, {"OMPI_COMM_WORLD_SIZE=1", "OMPI_COMM_WORLD_RANK=0"}},
      {"mnist_train", {"--dist", "none", "--batch-size", "100000000"}, 2,
       "--batch-size 100000000: one batch", Data::kNone,
       {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0"}},
      {"mnist_train", {"--batch-size", "100000000"}, 2, "--batch-size 100000000: one batch",
       Data::kNone, {"SLURM_NTASKS=4", "SLURM_PROCID=0"}},
      // Unsigned flags: no wrapping of negatives, no saturation past the maximum.
      {"mnist_train", {"--seed", "-1"}, 2,
       "--seed must be a whole number between 0 and 18446744073709551615 (got -1)"},
      {"mnist_train", {"--seed", "18446744073709551616"}, 2,
       "--seed must be a whole number between 0 and 18446744073709551615 (got 18446744073709551616)"},
      {"mnist_train", {"--seed", "1.5"}, 2, "--seed must be a whole number between 0 and"},
      {"mnist_train", {"--seed", "+3"}, 2, "--seed must be a whole number between 0 and"},
      {"loader_bench", {"--seed", "-1"}, 2,
       "--seed must be a whole number between 0 and 18446744073709551615 (got -1)"},
      // A path given as "" is a mistake, not "no output".
      {"mnist_train", {"--resume", ""}, 2, "--resume needs a file name"},
      {"mnist_train", {"--json", ""}, 2, "--json needs a file name"},
      {"mnist_train", {"--checkpoint", ""}, 2, "--checkpoint needs a file name"},
      {"mnist_train", {"--trace", ""}, 2, "--trace needs a file name"},
      {"mnist_train", {"--data", ""}, 2, "--data needs a directory name"},
      {"resnet_bench", {"--csv", ""}, 2, "--csv needs a file name"},
      {"resnet_bench", {"--json", ""}, 2, "--json needs a file name"},
      {"resnet_bench", {"--trace", ""}, 2, "--trace needs a file name"},
      {"comm_bench", {"--csv", ""}, 2, "--csv needs a file name"},
      {"comm_bench", {"--json", ""}, 2, "--json needs a file name"},
      {"loader_bench", {"--csv", ""}, 2, "--csv needs a file name"},
      {"loader_bench", {"--data", ""}, 2, "--data needs a directory name"},
      {"gemm_bench", {"--json", ""}, 2, "--json needs a file name"},
      {"idx_to_imagefolder", {"--out", ""}, 2, "--out needs a directory name"},
      {"idx_to_imagefolder", {"--out", kScratch, "--data", ""}, 2, "--data needs a directory name"},
      // Lists and sizes.
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--modes", ""}, 2,
       "--modes \"\" names no mode: give one or more of single, model-parallel, pipeline"},
      {"resnet_bench", {"--devices", "cpu:0,cpu:1", "--modes", ","}, 2, "names no mode"},
      {"comm_bench", {"--min-bytes", "-4K"}, 2, "--min-bytes -4K: expected a positive size in bytes"},
      {"comm_bench", {"--max-bytes", "-1"}, 2, "--max-bytes -1: expected a positive size in bytes"},
      // The minimal example: usage text, --help, and a bad number in words.
      {"train_mnist_minimal", {"--help"}, 0, ""},
      {"train_mnist_minimal", {kMnist, "abc"}, 2,
       "train_mnist_minimal: error: TRAIN_IMAGES must be a whole number of at least 1 (got abc)"},
      {"train_mnist_minimal", {kMnist, "0"}, 2, "TRAIN_IMAGES must be a whole number of at least 1 (got 0)"},
      {"train_mnist_minimal", {kMnist, "99999999999999999999"}, 2, "TRAIN_IMAGES must be a whole number"},
      {"train_mnist_minimal", {"--data", kMnist}, 2, "unknown option --data"},
      {"train_mnist_minimal", {kMnist, "10", "extra"}, 2, "usage: train_mnist_minimal [MNIST_DIR] [TRAIN_IMAGES]"},
      {"train_mnist_minimal", {"/nonexistent-kiln-dir"}, 2, "/nonexistent-kiln-dir"},

      // ---- vocabulary: old spellings (apps/common/flag_names.h), --version, checkpoint_tool ----
      // An old spelling works, with one line saying what to write instead; the new flag's
      // checks and messages apply to it.
      {"comm_bench",
       {"--transport", "local:2", "--min-bytes", "4K", "--max-bytes", "4K", "--iters", "1",
        "--warmup", "0", "--allreduce", "ring"},
       0, "comm_bench: --transport local:2 is deprecated: write --dist local:2"},
      {"comm_bench",
       {"--dist", "local:2", "--min-bytes", "4K", "--max-bytes", "4K", "--iters", "1",
        "--warmup", "0", "--algorithms=ring"},
       0, "comm_bench: --algorithms=ring is deprecated: write --allreduce=ring"},
      {"comm_bench",
       {"--dist", "local:2", "--min-bytes", "4K", "--max-bytes", "4K", "--iters", "1",
        "--warmup", "0", "--allreduce", "ring", "--dtype", "f16"},
       0, "comm_bench: --dtype f16 is deprecated: write --dtype fp16"},
      {"comm_bench", {"--transport", "local:99"}, 2, "--dist local:99: expected local:N"},
      {"comm_bench", {"--dtype", "f32", "--iters", "0"}, 2, "--dtype f32 is deprecated: write --dtype fp32"},
      {"gemm_bench", {"--dtypes", "f8"}, 2, "--precision must be one of bf16, fp16 (got f8)"},
      {"gemm_bench",
       {"--device", "cpu", "--sizes", "8", "--iters", "1", "--warmup", "0", "--kernels", "convert",
        "--dtypes", "bf16,f16"},
       0, "gemm_bench: --dtypes bf16,f16 is deprecated: write --precision bf16,fp16"},
      {"gemm_bench", {"--threads", "0"}, 2, "--threads must be at least 1 (got 0)"},
      {"gemm_bench", {"--device", "cpu", "--sizes", "8", "--iters", "1", "--warmup", "0", "--kernels",
                      "blas", "--threads", "1"}, 0, ""},
      {"train_step_bench", {"--tf32"}, 2, "train_step_bench: --tf32 is deprecated: write --precision tf32"},
      {"train_step_bench", {"--tf32"}, 2, "--precision tf32 needs a CUDA device"},
      {"loader_bench",
       {"--dataset", "synthetic", "--synthetic-size", "64", "--batch-size", "8", "--batches", "2",
        "--warmup-batches", "0", "--repeats", "1", "--workers", "0"},
       0, "loader_bench: --dataset synthetic is deprecated: write --format synthetic"},
      {"loader_bench", {"--dataset", "mnist-idx", "--batches", "0"}, 2,
       "loader_bench: --dataset mnist-idx is deprecated: write --format idx"},
      {"loader_bench", {"--format", "mnist-idx", "--batches", "0"}, 2,
       "loader_bench: --format mnist-idx is deprecated: write --format idx"},
      {"loader_bench", {"--dataset", "cifar"}, 2, "--format must be one of idx, imagefolder, synthetic"},
      // --json FILE in every app: the path is checked before any work.
      {"loader_bench", {"--format", "synthetic", "--json", "/"}, 2, "--json /"},
      {"train_step_bench", {"--json", "/"}, 2, "--json /"},
      {"conv_bench", {"--json", "/"}, 2, "--json /"},
      {"loader_bench", {"--format", "synthetic", "--json", kScratch, "--csv", kScratch}, 2,
       "name the same file"},
      // --version: every app, exit 0, nothing on stderr (Version.EveryAppPrintsItsNameAndKilnsVersion
      // checks stdout).
      {"mnist_train", {"--version"}, 0, ""},
      {"resnet_bench", {"--version"}, 0, ""},
      {"comm_bench", {"--version"}, 0, ""},
      {"loader_bench", {"--version"}, 0, ""},
      {"train_step_bench", {"--version"}, 0, ""},
      {"gemm_bench", {"--version"}, 0, ""},
      {"conv_bench", {"--version"}, 0, ""},
      {"idx_to_imagefolder", {"--version"}, 0, ""},
      {"checkpoint_tool", {"--version"}, 0, ""},
      {"checkpoint_tool", {"--help"}, 0, ""},
      {"checkpoint_tool", {"-h"}, 0, ""},
      {"checkpoint_tool", {}, 2, "usage: checkpoint_tool info FILE"},
      {"checkpoint_tool", {"frobnicate", "x"}, 2, "usage: checkpoint_tool"},
      {"checkpoint_tool", {"get", "/nonexistent-kiln.ckpt", "w", "--head", "-2"}, 2,
       "--head must be a whole number, at least -1 (got -2)"},
      {"checkpoint_tool", {"info", "/nonexistent-kiln.ckpt"}, 2, "/nonexistent-kiln.ckpt"},

      // ---- output paths: special files, one file for two outputs, unwritable places ----
      // A row naming a device also carries a flag that fails later (bad --data, one device):
      // were the path check gone, the app would stop there instead of replacing /dev/null.
      {"mnist_train", {"--checkpoint", "/dev/null", "--data", "/nonexistent-kiln-dir"}, 2,
       "--checkpoint /dev/null is a character device, not a regular file"},
      {"mnist_train", {"--trace", out_fixture("fifo")}, 2, "is a FIFO (named pipe), not a regular file"},
      {"mnist_train", {"--json", out_fixture("dir")}, 2, "dir: Is a directory: give the path of a file"},
      {"mnist_train", {"--json", out_fixture("file") + "/run.json"}, 2, "file is not a directory: Not a directory"},
      {"mnist_train", {"--checkpoint", "/nonexistent-kiln-dir/a.ckpt"}, 2,
       "--checkpoint /nonexistent-kiln-dir/a.ckpt: the directory /nonexistent-kiln-dir does not exist"},
      {"mnist_train", {"--json", "kiln-same.out", "--checkpoint", "kiln-same.out"}, 2,
       "--json kiln-same.out and --checkpoint kiln-same.out name the same file"},
      {"mnist_train", {"--json", "kiln-same.out", "--trace", "./kiln-same.out"}, 2,
       "--json kiln-same.out and --trace ./kiln-same.out name the same file"},
      {"mnist_train", {"--json", out_fixture("file"), "--trace", out_fixture("link")}, 2,
       "name the same file: one would overwrite the other"},
      {"mnist_train", {"--resume", "kiln-run.ckpt", "--json", "kiln-run.ckpt"}, 2,
       "--json kiln-run.ckpt is the input --resume kiln-run.ckpt"},
      {"mnist_train", {"--data", out_fixture("data"), "--json", out_fixture("data/train-images-idx3-ubyte")},
       2, "is the input --data"},
      {"resnet_bench", {"--json", "/dev/null", "--devices", "cpu:0"}, 2,
       "--json /dev/null is a character device"},
      {"resnet_bench", {"--trace", out_fixture("fifo"), "--devices", "cpu:0"}, 2, "is a FIFO (named pipe)"},
      {"resnet_bench", {"--csv", out_fixture("dir"), "--devices", "cpu:0"}, 2, "Is a directory"},
      {"resnet_bench", {"--json", "/nonexistent-kiln-dir/r.json", "--devices", "cpu:0"}, 2,
       "does not exist: create it first"},
      {"resnet_bench", {"--json", "kiln-same.out", "--trace", "kiln-same.out", "--devices", "cpu:0"}, 2,
       "--json kiln-same.out and --trace kiln-same.out name the same file"},
      {"comm_bench", {"--csv", out_fixture("fifo")}, 2, "is a FIFO (named pipe)"},
      {"comm_bench", {"--json", out_fixture("dir")}, 2, "Is a directory"},
      {"comm_bench", {"--json", out_fixture("file") + "/c.json"}, 2, "Not a directory"},
      {"comm_bench", {"--csv", "kiln-same.out", "--json", "kiln-same.out"}, 2,
       "--csv kiln-same.out and --json kiln-same.out name the same file"},
      {"loader_bench", {"--csv", "/dev/null", "--data", "/nonexistent-kiln-dir"}, 2,
       "--csv /dev/null is a character device"},
      {"loader_bench", {"--csv", out_fixture("dir")}, 2, "Is a directory"},
      {"loader_bench", {"--csv", "/nonexistent-kiln-dir/l.csv"}, 2, "does not exist: create it first"},
      {"loader_bench", {"--data", out_fixture("data"), "--csv", out_fixture("data/train-images-idx3-ubyte")},
       2, "is the input --data"},
      {"gemm_bench", {"--json", "/dev/null", "--device", "cpu", "--sizes", "1000000"}, 2,
       "--json /dev/null is a character device"},
      {"gemm_bench", {"--json", out_fixture("fifo"), "--device", "cpu", "--sizes", "1000000"}, 2,
       "is a FIFO (named pipe)"},
      {"gemm_bench", {"--json", "/nonexistent-kiln-dir/g.json", "--device", "cpu", "--sizes", "1000000"},
       2, "does not exist: create it first"},
      {"idx_to_imagefolder", {"--out", out_fixture("file")}, 2, "is a file, not a directory"},
      {"idx_to_imagefolder", {"--out", "/dev/null", "--data", "/nonexistent-kiln-dir"}, 2,
       "is a character device, not a directory"},
      {"idx_to_imagefolder", {"--out", out_fixture("file") + "/png"}, 2, "is not a directory"},

      // ---- data: empty or inconsistent sets, damaged images, unreachable paths ----
      {"mnist_train", {"--data", data_fixture("empty_train"), "--epochs", "1", "--quiet"}, 2,
       "empty_train/train-images-idx3-ubyte: holds no images"},
      {"mnist_train", {"--data", data_fixture("empty_test"), "--epochs", "1", "--quiet"}, 2,
       "empty_test/t10k-images-idx3-ubyte: holds no images"},
      {"mnist_train", {"--format", "imagefolder", "--data", data_fixture("classes"), "--epochs", "1", "--quiet"},
       2, "have different class folders (only in "},
      {"mnist_train", {"--format", "imagefolder", "--data", data_fixture("classes"), "--epochs", "1", "--quiet"},
       2, "classes/train: 9; only in "},
      {"mnist_train", {"--format", "imagefolder", "--data", data_fixture("classes"), "--epochs", "1", "--quiet"},
       2, "classes/test: x)"},
      // A damaged image fails its batch as any undecodable image does: the loader names the
      // batch, the index and the file.
      {"mnist_train", {"--format", "imagefolder", "--data", data_fixture("damaged"), "--epochs", "1",
                       "--workers", "0", "--threads", "1", "--quiet"},
       2, "0.png: the CRC of chunk IDAT does not match its data: the file is damaged"},
      {"loader_bench", {"--data", data_fixture("two"), "--batch-size", "100"}, 2,
       "--batch-size 100 is larger than the 2 images of the training set: lower --batch-size"},
      {"loader_bench", {"--format", "imagefolder", "--data", data_fixture("damaged"), "--batch-size", "2",
                        "--batches", "1", "--warmup-batches", "0", "--repeats", "1", "--workers", "0"},
       2, "the CRC of chunk IDAT does not match its data"},
      // A path stat(2) cannot follow (here a loop of symbolic links, which fails for root too,
      // as EACCES does not): the system's reason, not "not found".
      {"mnist_train", {"--data", data_fixture("loop"), "--epochs", "1", "--quiet"}, 2,
       "loop/train-images-idx3-ubyte: cannot be reached: Too many levels of symbolic links"},
      {"mnist_train", {"--format", "imagefolder", "--data", data_fixture("loop"), "--epochs", "1", "--quiet"}, 2,
       "loop/train: Too many levels of symbolic links"},
  };
  return table;
}

bool have_mnist() {
  return std::filesystem::exists(kMnist + "/train-images-idx3-ubyte") &&
         std::filesystem::exists(kMnist + "/t10k-labels-idx1-ubyte");
}

// Single quotes for the shell.
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class BadInvocations : public ::testing::TestWithParam<size_t> {};

TEST_P(BadInvocations, ExitCodeAndMessage) {
  const Row& row = rows()[GetParam()];
  std::string cmd = quoted(app_path(row.app));
  if (!row.env.empty()) {
    std::string env = "env";
    for (const std::string& e : row.env) env += " " + quoted(e);
    cmd = env + " " + cmd;
  }
  for (const std::string& a : row.args) cmd += " " + quoted(a);
  SCOPED_TRACE(cmd);
  if (row.data == Data::kNeedsMnist && !have_mnist()) {
    GTEST_SKIP() << "real MNIST not found in " << kMnist << ": run datasets/fetch_mnist.sh";
  }
  // stderr alone (stdout goes away): the message must be on the error stream.
  const kiln::testing::RunResult r = kiln::testing::run_command(cmd + " 2>&1 >/dev/null");
  EXPECT_EQ(r.exit_code, row.exit_code) << r.output;
  EXPECT_NE(r.output.find(row.stderr_has), std::string::npos)
      << "stderr lacks \"" << row.stderr_has << "\":\n" << r.output;
  // No row may show CLI11's raw validator text.
  EXPECT_EQ(r.output.find("not in range"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("179769313486231570814527"), std::string::npos) << r.output;
  // Bad usage and bad input never leave a half-written output behind.
  if (row.exit_code == 2) {
    EXPECT_FALSE(std::filesystem::exists(kScratch)) << kScratch;
  }
}

std::string row_name(const ::testing::TestParamInfo<size_t>& info) {
  const Row& row = rows()[info.param];
  return std::string(row.app) + "_" + std::to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(Apps, BadInvocations, ::testing::Range<size_t>(0, rows().size()),
                         row_name);

// `<app> --version` prints "<app> (Kiln) <version>" on stdout (apps/common/version.h).
TEST(Version, EveryAppPrintsItsNameAndKilnsVersion) {
  for (const char* app : {"mnist_train", "resnet_bench", "comm_bench", "loader_bench",
                          "train_step_bench", "gemm_bench", "conv_bench", "idx_to_imagefolder",
                          "checkpoint_tool"}) {
    const kiln::testing::RunResult r =
        kiln::testing::run_command(quoted(app_path(app)) + " --version 2>/dev/null");
    EXPECT_EQ(r.exit_code, 0) << app;
    EXPECT_EQ(r.output.rfind(std::string(app) + " (Kiln) " + KILN_VERSION, 0), 0u)
        << app << ": " << r.output;
  }
}

}  // namespace
