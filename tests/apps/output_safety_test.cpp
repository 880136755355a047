// output_safety_test: what Kiln's apps write never replaces what it must not, and a write that
// fails says why, with the real binaries on a tiny MNIST written here (no download needed).
//
//   1. Special files: an output given as a FIFO (mkfifo) or /dev/full is refused before any
//      work (exit 2), and afterwards the FIFO is still a FIFO, the device still that device,
//      and the run's other output, an existing file, keeps its bytes. Without the check the
//      writers' rename would replace the FIFO with a regular file (as `mnist_train --checkpoint
//      /dev/full` once turned the device into one, run as root). The /dev/full run also gives
//      a --data that fails after the check, so that a missing check fails the test without
//      replacing the machine's device.
//   2. Two outputs on one file (the same name, "./name", a hard link) and an output on an input:
//      exit 2, the file's bytes unchanged.
//   3. A file-size limit (`ulimit -f 0`: /bin/sh calls setrlimit(RLIMIT_FSIZE) before it execs
//      the app): every writer (JSON summaries, traces, CSV rows, the PNGs of
//      idx_to_imagefolder) exits 1 with the system's words ("File too large") naming the file,
//      not killed by SIGXFSZ; an existing output keeps its old bytes and no temporary file is
//      left next to it.
//   4. Permissions (skipped as root, whom permission bits do not stop): a read-only directory
//      or output file is refused before any work, with "Permission denied".
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "support/file_bytes.h"
#include "support/run_command.h"
#include "support/tiny_mnist.h"

namespace {

namespace fs = std::filesystem;

const char* const kOldBytes = "the previous run's output\n";

// Single quotes for the shell.
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string text_of(const std::string& path) {
  const std::vector<char> bytes = kiln::testing::read_bytes(path);
  return std::string(bytes.begin(), bytes.end());
}

class OutputSafety : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("kiln_output_safety_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    kiln::testing::write_tiny_mnist_split(dir_ / "data", "train", 64);
    kiln::testing::write_tiny_mnist_split(dir_ / "data", "t10k", 32);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_ / "ro", fs::perms::owner_all, ec);  // a read-only row's directory
    fs::remove_all(dir_, ec);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // An existing output holding kOldBytes.
  std::string old_output(const std::string& name) const {
    std::ofstream(path(name)) << kOldBytes;
    return path(name);
  }

  // mnist_train's flags for a run of a second per epoch on the tiny MNIST.
  std::vector<std::string> tiny_mnist_train(const char* epochs = "1") const {
    return {"--data", path("data"), "--epochs", epochs, "--batch-size", "32", "--threads", "1",
            "--workers", "0", "--quiet"};
  }

  // Runs `program` with `args`, under a file-size limit of 0 bytes when `limited`; returns its
  // exit code (-1 when a signal ended it) and its stderr.
  kiln::testing::RunResult run(const std::string& program, const std::vector<std::string>& args,
                               bool limited = false) const {
    std::string cmd = "cd " + quoted(dir_.string()) + " && ";
    if (limited) cmd += "ulimit -f 0 && ";
    cmd += "exec " + quoted(program);
    for (const std::string& a : args) cmd += " " + quoted(a);
    return kiln::testing::run_command(cmd + " 2>&1 >/dev/null");
  }

  // No temporary file of a writer is left in the test's directory.
  void expect_no_temporary_files() const {
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      EXPECT_EQ(name.find(".tmp"), std::string::npos) << "left behind: " << entry.path();
    }
  }

  fs::path dir_;
};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool is_fifo(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

// ---- 1. special files --------------------------------------------------------------------------

struct SpecialCase {
  const char* program;
  std::vector<std::string> args;  // the app's flags, "FIFO" and "OTHER" standing for the paths
};

TEST_F(OutputSafety, FifoIsRefusedAndKeptAndTheOtherOutputUnchanged) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  const std::vector<SpecialCase> cases = {
      {KILN_APP_MNIST_TRAIN, tiny_mnist_train() + std::vector<std::string>{"--json", "OTHER", "--trace", "FIFO"}},
      {KILN_APP_MNIST_TRAIN, tiny_mnist_train() + std::vector<std::string>{"--json", "OTHER", "--checkpoint", "FIFO"}},
      {KILN_APP_RESNET_BENCH, {"--json", "OTHER", "--trace", "FIFO"}},
      {KILN_APP_COMM_BENCH, {"--json", "OTHER", "--csv", "FIFO"}},
      {KILN_APP_LOADER_BENCH, {"--data", path("data"), "--csv", "FIFO"}},
      {KILN_APP_GEMM_BENCH, {"--device", "cpu", "--json", "FIFO"}},
  };
  for (const SpecialCase& c : cases) {
    std::vector<std::string> args = c.args;
    for (std::string& a : args) {
      if (a == "FIFO") a = path("fifo");
      if (a == "OTHER") a = old_output("other.json");
    }
    const kiln::testing::RunResult r = run(c.program, args);
    SCOPED_TRACE(std::string(c.program) + ": " + r.output);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.output.find("is a FIFO (named pipe), not a regular file"), std::string::npos);
    EXPECT_TRUE(is_fifo(path("fifo"))) << "the FIFO was replaced";
    EXPECT_EQ(text_of(path("other.json")), kOldBytes);
  }
  expect_no_temporary_files();
}

// /dev/full, where present: the device the checkpoint writer once replaced with a regular file.
TEST_F(OutputSafety, DeviceIsRefusedAndStaysADevice) {
  struct stat before;
  if (::stat("/dev/full", &before) != 0 || !S_ISCHR(before.st_mode)) {
    GTEST_SKIP() << "no /dev/full here";
  }
  std::vector<std::string> args = tiny_mnist_train() + std::vector<std::string>{
                                      "--json", old_output("run.json"), "--checkpoint", "/dev/full"};
  args[1] = path("no-such-data");  // refused after the outputs, before any write
  const kiln::testing::RunResult r = run(KILN_APP_MNIST_TRAIN, args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--checkpoint /dev/full is a character device, not a regular file"),
            std::string::npos) << r.output;
  struct stat after;
  ASSERT_EQ(::stat("/dev/full", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode)) << "/dev/full is no longer a character device";
  EXPECT_EQ(after.st_rdev, before.st_rdev);
  EXPECT_EQ(text_of(path("run.json")), kOldBytes);
}

// ---- 2. one file for two outputs, an output on an input --------------------------------------

TEST_F(OutputSafety, OneFileForTwoOutputsIsRefusedAndKeepsItsBytes) {
  const std::string same = old_output("same.out");
  ASSERT_EQ(::link(same.c_str(), path("hard.out").c_str()), 0);
  const std::vector<std::vector<std::string>> cases = {
      {"--json", same, "--checkpoint", same},
      {"--json", "same.out", "--trace", "./same.out"},  // relative to the app's directory
      {"--json", same, "--trace", path("hard.out")},
      {"--json", path("data/train-labels-idx1-ubyte")},
  };
  const std::string labels_before = text_of(path("data/train-labels-idx1-ubyte"));
  for (const std::vector<std::string>& outputs : cases) {
    const kiln::testing::RunResult r = run(KILN_APP_MNIST_TRAIN, tiny_mnist_train() + outputs);
    SCOPED_TRACE(outputs[0] + " " + outputs[1] + ": " + r.output);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_TRUE(r.output.find("name the same file") != std::string::npos ||
                r.output.find("is the input --data") != std::string::npos);
    EXPECT_EQ(text_of(same), kOldBytes);
    EXPECT_EQ(text_of(path("data/train-labels-idx1-ubyte")), labels_before);
  }
  // Resuming from the file the run checkpoints to is the normal use: allowed (the tiny run
  // writes the checkpoint, then continues from it).
  const std::string ckpt = path("run.ckpt");
  ASSERT_EQ(run(KILN_APP_MNIST_TRAIN, tiny_mnist_train() + std::vector<std::string>{
                                          "--checkpoint", ckpt}).exit_code, 0);
  const kiln::testing::RunResult r = run(
      KILN_APP_MNIST_TRAIN,
      tiny_mnist_train("2") + std::vector<std::string>{"--resume", ckpt, "--checkpoint", ckpt});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// ---- 3. a file-size limit ------------------------------------------------------------------------

struct LimitCase {
  const char* name;
  const char* program;
  std::vector<std::string> args;  // "OLD" stands for the existing output
  const char* flag;               // the flag named in the message
};

TEST_F(OutputSafety, FileSizeLimitIsAnErrorInWordsAndKeepsTheOldOutput) {
  const std::vector<std::string> rb_tiny = {
      "--model", "resnet18", "--width", "8", "--image-size", "64", "--batch-size", "4",
      "--classes", "5", "--steps", "1", "--repeats", "1", "--devices", "cpu:0,cpu:1",
      "--modes", "pipeline", "--split-sizes", "2"};
  const std::vector<std::string> comm_tiny = {"--min-bytes", "4K", "--max-bytes", "4K",
                                              "--iters", "1", "--warmup", "0"};
  const std::vector<LimitCase> cases = {
      {"mnist_train --json", KILN_APP_MNIST_TRAIN,
       tiny_mnist_train() + std::vector<std::string>{"--json", "OLD"}, "--json"},
      {"mnist_train --trace", KILN_APP_MNIST_TRAIN,
       tiny_mnist_train() + std::vector<std::string>{"--trace", "OLD"}, "--trace"},
      {"resnet_bench --json", KILN_APP_RESNET_BENCH,
       rb_tiny + std::vector<std::string>{"--json", "OLD"}, "--json"},
      {"comm_bench --json", KILN_APP_COMM_BENCH,
       comm_tiny + std::vector<std::string>{"--json", "OLD"}, "--json"},
      {"comm_bench --csv --append", KILN_APP_COMM_BENCH,
       comm_tiny + std::vector<std::string>{"--csv", "OLD", "--append"}, "--csv"},
      {"loader_bench --csv --append", KILN_APP_LOADER_BENCH,
       {"--data", path("data"), "--batch-size", "8", "--batches", "2", "--warmup-batches", "0",
        "--repeats", "1", "--workers", "0", "--csv", "OLD", "--append"},
       "--csv"},
      {"gemm_bench --json", KILN_APP_GEMM_BENCH,
       {"--device", "cpu", "--sizes", "8", "--iters", "1", "--warmup", "0", "--kernels", "blas",
        "--json", "OLD"},
       "--json"},
  };
  for (const LimitCase& c : cases) {
    const std::string old = old_output("old.out");
    std::vector<std::string> args = c.args;
    for (std::string& a : args) {
      if (a == "OLD") a = old;
    }
    const kiln::testing::RunResult r = run(c.program, args, /*limited=*/true);
    SCOPED_TRACE(std::string(c.name) + ": " + r.output);
    EXPECT_EQ(r.exit_code, 1) << "-1: killed by a signal (SIGXFSZ?)";
    EXPECT_NE(r.output.find(std::string(c.flag) + " " + old), std::string::npos);
    EXPECT_NE(r.output.find("File too large"), std::string::npos);
    EXPECT_EQ(text_of(old), kOldBytes);
    expect_no_temporary_files();
  }
}

TEST_F(OutputSafety, FileSizeLimitLeavesNoHalfExportedSplit) {
  const kiln::testing::RunResult r =
      run(KILN_APP_IDX_TO_IMAGEFOLDER, {"--data", path("data"), "--out", path("png")}, true);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("File too large"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(path("png")), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(path("png/train"))) << "a split that looks whole";
  EXPECT_FALSE(fs::exists(path("png/train.tmp"))) << "the unfinished split stayed";
}

// ---- 4. permissions ------------------------------------------------------------------------------

TEST_F(OutputSafety, ReadOnlyDirectoryOrFileIsRefusedBeforeAnyWork) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: permission bits do not stop root";
  fs::create_directories(path("ro"));
  fs::permissions(path("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  const std::string ro_file = old_output("ro.json");
  fs::permissions(ro_file, fs::perms::owner_read);
  for (const std::string& out : {path("ro/run.json"), ro_file}) {
    const kiln::testing::RunResult r =
        run(KILN_APP_MNIST_TRAIN, tiny_mnist_train() + std::vector<std::string>{"--json", out});
    EXPECT_EQ(r.exit_code, 2) << out << ": " << r.output;
    EXPECT_NE(r.output.find("Permission denied"), std::string::npos) << r.output;
  }
  EXPECT_EQ(text_of(ro_file), kOldBytes);
}

}  // namespace
