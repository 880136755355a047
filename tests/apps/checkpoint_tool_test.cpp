// checkpoint_tool_test: what checkpoint_tool prints for equal and differing files (compare) and
// for a tensor (get), on small checkpoints written here (engine/serialize.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/serialize.h"
#include "engine/tensor.h"
#include "support/run_command.h"

namespace {

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "kiln_checkpoint_tool_test_" + name;
}

// Runs checkpoint_tool with `args`; `streams` picks what is captured ("2>&1" for both).
kiln::testing::RunResult tool(const std::string& args, const std::string& streams = "2>&1") {
  return kiln::testing::run_command(std::string("'") + KILN_CHECKPOINT_TOOL + "' " + args + " " +
                                    streams);
}

void write(const std::string& path, const std::vector<float>& w) {
  const std::map<std::string, kiln::Tensor> tensors = {
      {"w", kiln::Tensor::from_vector(w, {static_cast<int64_t>(w.size())})},
      {"b", kiln::Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {2})}};
  kiln::write_checkpoint(path, tensors, {{"epoch", "3"}});
}

TEST(CheckpointTool, CompareSaysEqual) {
  const std::string a = temp("eq_a.ckpt"), b = temp("eq_b.ckpt");
  write(a, {1, 2, 3, 4});
  write(b, {1, 2, 3, 4});
  const kiln::testing::RunResult r = tool("compare '" + a + "' '" + b + "'", "2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "equal (2 tensor records)\n");
}

// Two of four elements differ: 2 -> 2.5 (abs 0.5, rel 0.5 / 2.5 = 0.2) and 4 -> 3 (abs 1,
// rel 1 / 4 = 0.25).
TEST(CheckpointTool, CompareSaysByHowMuchTensorsDiffer) {
  const std::string a = temp("ne_a.ckpt"), b = temp("ne_b.ckpt");
  write(a, {1, 2, 3, 4});
  write(b, {1, 2.5f, 3, 3});
  const kiln::testing::RunResult r = tool("compare '" + a + "' '" + b + "'", "2>&1 >/dev/null");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("w: 2 of 4 elements differ, max abs diff 1, max rel diff 0.25"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("b:"), std::string::npos) << r.output;  // b is equal
  EXPECT_NE(r.output.find("1 of the tensor records differ"), std::string::npos) << r.output;
}

TEST(CheckpointTool, GetPrintsATensorsValuesAndSummary) {
  const std::string a = temp("get.ckpt");
  write(a, {1, -2, 3.5f, 4});
  const kiln::testing::RunResult all = tool("get '" + a + "' w", "2>&1");
  EXPECT_EQ(all.exit_code, 0) << all.output;
  EXPECT_EQ(all.output,
            "tensor w f32 [4] (4 elements)\n"
            "values: 1 -2 3.5 4\n"
            "min -2  max 4  mean 1.625  nan 0  inf 0\n");
  const kiln::testing::RunResult head = tool("get '" + a + "' w --head 2", "2>&1");
  EXPECT_EQ(head.exit_code, 0) << head.output;
  EXPECT_NE(head.output.find("first 2: 1 -2\n"), std::string::npos) << head.output;
  // A meta entry still prints its value alone (scripts read it).
  EXPECT_EQ(tool("get '" + a + "' epoch", "2>&1").output, "3\n");
  const kiln::testing::RunResult missing = tool("get '" + a + "' nothing", "2>&1");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("no meta entry or tensor 'nothing'"), std::string::npos)
      << missing.output;
}

}  // namespace
