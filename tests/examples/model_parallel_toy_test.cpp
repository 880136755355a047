// model_parallel_toy_test: the model-parallel toy example runs, and its two runs agree.
#include <gtest/gtest.h>

#include <string>

#include "support/run_command.h"

namespace {

using kiln::testing::RunResult;

// Runs the example with `args` (already quoted for the shell) and captures its output.
RunResult run_toy(const std::string& args) {
  return kiln::testing::run_command(std::string("'") + KILN_MODEL_PARALLEL_TOY + "' " + args +
                                    " 2>&1");
}

TEST(ModelParallelToy, ByHandAndByPipelineGiveTheSameLosses) {
  RunResult r = run_toy("");  // cpu:0 cpu:1
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("net1 on cpu:0, net2 on cpu:1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("losses agree after 5 steps"), std::string::npos) << r.output;
}

TEST(ModelParallelToy, ABadDeviceExitsTwoNamingIt) {
  RunResult r = run_toy("cpu:0 tpu:1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("tpu:1"), std::string::npos) << r.output;
  EXPECT_EQ(run_toy("cpu:0").exit_code, 2);  // one device only: the usage line
}

}  // namespace
