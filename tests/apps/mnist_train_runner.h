// mnist_train_runner.h: what the mnist_train e2e tests share: run the real binary (its path is
// KILN_MNIST_TRAIN, set by CMake), find real MNIST, a scratch directory per test, read JSON.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/run_command.h"

namespace fs = std::filesystem;

namespace {

using kiln::testing::RunResult;

// Runs mnist_train with `args` (each single-quoted for the shell) and captures its output.
RunResult run_mnist_train(const std::vector<std::string>& args) {
  std::string cmd = std::string("'") + KILN_MNIST_TRAIN + "'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  return kiln::testing::run_command(cmd + " 2>&1");
}

std::string mnist_dir() { return std::string(KILN_SOURCE_DIR) + "/datasets/mnist"; }

[[maybe_unused]] bool have_mnist() {
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    if (!fs::exists(mnist_dir() + "/" + f)) return false;
  }
  return true;
}

#define SKIP_WITHOUT_MNIST()                                                         \
  do {                                                                               \
    if (!have_mnist())                                                               \
      GTEST_SKIP() << "real MNIST not found in " << mnist_dir()                      \
                   << ": run datasets/fetch_mnist.sh";                               \
  } while (0)

// A fresh scratch directory per test.
class MnistTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("kiln_mnist_train_" + std::string(info->name()) + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

[[maybe_unused]] nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "no JSON summary at " << path;
  return nlohmann::json::parse(in);
}

}  // namespace
