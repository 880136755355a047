// model_parallel_toy_test: the model-parallel toy example runs, and its two runs agree.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs the example with `args` (already quoted for the shell) and captures its output.
RunResult run_toy(const std::string& args) {
  RunResult r;
  const std::string cmd = std::string("'") + KILN_MODEL_PARALLEL_TOY + "' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
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
