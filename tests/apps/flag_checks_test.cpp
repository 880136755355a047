// flag_checks_test: the flag validators' words and edges (apps/common/flag_checks.h), through
// a real CLI11 parse: the message a user reads, the value that passes, the exit code.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "apps/common/flag_checks.h"

namespace {

using kiln::apps::above;
using kiln::apps::at_least;
using kiln::apps::in_range;
using kiln::apps::one_of;

// Parses `--x <text>` with `validator` on a flag of type T: "" when it passes, else CLI11's
// message for the flag ("--x: must be ...").
template <typename T>
std::string verdict(const CLI::Validator& validator, const std::string& text, T* out = nullptr) {
  CLI::App app;
  T value{};
  app.add_option("--x", value)->check(validator);
  std::vector<std::string> args{text, "--x"};  // CLI11 parses a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  if (out) *out = value;
  return "";
}

TEST(FlagChecks, WholeNumbersSayTheBoundAndTheValue) {
  int v = 0;
  EXPECT_EQ(verdict<int>(at_least(1), "3", &v), "");
  EXPECT_EQ(v, 3);
  EXPECT_EQ(verdict<int>(at_least(1), "1"), "");
  EXPECT_EQ(verdict<int>(at_least(1), "0"), "--x: must be at least 1 (got 0)");
  EXPECT_EQ(verdict<int>(at_least(1), "-7"), "--x: must be at least 1 (got -7)");
  EXPECT_EQ(verdict<int>(at_least(1), "2.5"), "--x: must be a whole number, at least 1 (got 2.5)");
  EXPECT_EQ(verdict<int>(at_least(1), "abc"), "--x: must be a whole number, at least 1 (got abc)");
  // Above the type's range: said, not wrapped or left to CLI11's "Could not convert".
  EXPECT_EQ(verdict<int>(at_least(1), "3000000000"), "--x: must be at most 2147483647 (got 3000000000)");
  EXPECT_EQ(verdict<int64_t>(at_least(int64_t{1}), "99999999999999999999"),
            "--x: must be at most 9223372036854775807 (got 99999999999999999999)");
  EXPECT_EQ(verdict<int64_t>(at_least(int64_t{1}), "-99999999999999999999"),
            "--x: must be at least 1 (got -99999999999999999999)");
  EXPECT_EQ(verdict<int64_t>(at_least(int64_t{1}), "3000000000"), "");
  EXPECT_EQ(verdict<int>(in_range(2, 1024), "1"), "--x: must be between 2 and 1024 (got 1)");
  EXPECT_EQ(verdict<int>(in_range(2, 1024), "1025"), "--x: must be between 2 and 1024 (got 1025)");
  EXPECT_EQ(verdict<int>(in_range(2, 1024), "1024"), "");
  // An unsigned type's limit does not wrap to -1.
  EXPECT_EQ(verdict<uint64_t>(at_least(uint64_t{0}), "5"), "");
}

TEST(FlagChecks, RealsAreFiniteAndOpenBoundsSaySo) {
  double v = 0;
  EXPECT_EQ(verdict<double>(above(0.0), "0.5", &v), "");
  EXPECT_EQ(v, 0.5);
  EXPECT_EQ(verdict<double>(above(0.0), "0"), "--x: must be > 0 (got 0)");
  EXPECT_EQ(verdict<double>(above(0.0), "-1"), "--x: must be > 0 (got -1)");
  EXPECT_EQ(verdict<double>(above(0.0), "nan"), "--x: must be a number, > 0 (got nan)");
  EXPECT_EQ(verdict<double>(above(0.0), "inf"), "--x: must be a number, > 0 (got inf)");
  EXPECT_EQ(verdict<double>(above(0.0), "1e-3"), "");
  EXPECT_EQ(verdict<double>(at_least(0.0), "0"), "");
  EXPECT_EQ(verdict<double>(at_least(0.0), "-0.25"), "--x: must be at least 0 (got -0.25)");
  EXPECT_EQ(verdict<double>(in_range(0.01, 0.99), "0.99"), "");
  EXPECT_EQ(verdict<double>(in_range(0.01, 0.99), "1"), "--x: must be between 0.01 and 0.99 (got 1)");
  EXPECT_EQ(verdict<double>(in_range(1.0, 1e12), "0"), "--x: must be between 1 and 1000000000000 (got 0)");
}

TEST(FlagChecks, ChoicesListEveryOption) {
  const CLI::Validator precision = one_of({"fp32", "tf32", "bf16", "fp16"});
  EXPECT_EQ(verdict<std::string>(precision, "bf16"), "");
  EXPECT_EQ(verdict<std::string>(precision, "fp64"),
            "--x: must be one of fp32, tf32, bf16, fp16 (got fp64)");
  EXPECT_EQ(verdict<std::string>(precision, "BF16"),
            "--x: must be one of fp32, tf32, bf16, fp16 (got BF16)");
}

TEST(FlagChecks, UnsignedFlagsNeitherWrapNorSaturate) {
  const CLI::Validator seed = kiln::apps::any_unsigned<uint64_t>();
  const std::string range = "--x: must be a whole number between 0 and 18446744073709551615";
  uint64_t v = 0;
  EXPECT_EQ(verdict<uint64_t>(seed, "18446744073709551615", &v), "");
  EXPECT_EQ(v, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(verdict<uint64_t>(seed, "0", &v), "");
  EXPECT_EQ(v, 0u);
  EXPECT_EQ(verdict<uint64_t>(seed, "-1"), range + " (got -1)");  // strtoull: 2^64 - 1
  EXPECT_EQ(verdict<uint64_t>(seed, "18446744073709551616"), range + " (got 18446744073709551616)");
  EXPECT_EQ(verdict<uint64_t>(seed, "99999999999999999999999"), range + " (got 99999999999999999999999)");
  for (const char* bad : {"+1", " 1", "1.5", "1e3", "0x10", "", "abc"}) {
    EXPECT_EQ(verdict<uint64_t>(seed, bad), range + " (got " + bad + ")") << bad;
  }
  EXPECT_EQ(verdict<uint32_t>(kiln::apps::any_unsigned<uint32_t>(), "4294967296"),
            "--x: must be a whole number between 0 and 4294967295 (got 4294967296)");
}

TEST(FlagChecks, AnEmptyPathIsRefusedOnEveryPathFlag) {
  EXPECT_EQ(verdict<std::string>(kiln::apps::non_empty_path(), ""), "--x: needs a file name");
  EXPECT_EQ(verdict<std::string>(kiln::apps::non_empty_path(), "out.json"), "");
  // parse_flags puts the check on the app's path flags by name.
  CLI::App app{"test app"};
  std::string json, data;
  app.add_option("--json", json);
  app.add_option("--data", data);
  ::testing::internal::CaptureStderr();
  const char* empty_json[] = {"app", "--json", ""};
  EXPECT_EQ(kiln::apps::parse_flags(app, 3, const_cast<char**>(empty_json), "app"), 2);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("app: error: --json needs a file name\n"), std::string::npos) << err;
  CLI::App app2{"test app"};
  app2.add_option("--data", data);
  ::testing::internal::CaptureStderr();
  const char* empty_data[] = {"app", "--data", ""};
  EXPECT_EQ(kiln::apps::parse_flags(app2, 3, const_cast<char**>(empty_data), "app"), 2);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("app: error: --data needs a directory name\n"), std::string::npos) << err;
}

TEST(FlagChecks, ParseFlagsExitCodes) {
  CLI::App app{"test app"};
  int epochs = 1;
  app.add_option("--epochs", epochs)->check(at_least(1));
  const char* ok[] = {"app", "--epochs", "3"};
  EXPECT_FALSE(kiln::apps::parse_flags(app, 3, const_cast<char**>(ok), "app").has_value());
  EXPECT_EQ(epochs, 3);
  const char* bad[] = {"app", "--epochs", "0"};
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(kiln::apps::parse_flags(app, 3, const_cast<char**>(bad), "app"), 2);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("app: error: --epochs must be at least 1 (got 0)\n"), std::string::npos) << err;
  EXPECT_NE(err.find("Run app --help"), std::string::npos) << err;
  const char* help[] = {"app", "--help"};
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(kiln::apps::parse_flags(app, 2, const_cast<char**>(help), "app"), 0);
  EXPECT_NE(::testing::internal::GetCapturedStdout().find("--epochs"), std::string::npos);
}

TEST(FlagChecks, SizesThatCannotFitAreInputErrorsNamingTheFlag) {
  const int64_t total = kiln::apps::physical_memory_bytes();
  ASSERT_GT(total, 0);
  EXPECT_NO_THROW(kiln::apps::check_fits_in_memory("--batch-size", "2", 1024.0, "one batch"));
  try {
    kiln::apps::check_fits_in_memory("--batch-size", "100000000", 2.0 * total, "one batch");
    FAIL() << "twice the machine's memory passed";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("--batch-size 100000000: one batch would need ", 0), 0u) << what;
    EXPECT_NE(what.find("lower --batch-size"), std::string::npos) << what;
  }
  const kiln::Error sized = kiln::apps::size_error(kiln::OutOfMemory("out of CPU memory"),
                                                   "--batch-size 128");
  EXPECT_EQ(sized.exit_code(), 2);
  EXPECT_NE(std::string(sized.what()).find("--batch-size 128"), std::string::npos);
  EXPECT_NE(std::string(sized.what()).find("out of CPU memory"), std::string::npos);
  EXPECT_EQ(kiln::apps::human_bytes(313600000000.0), "292 GiB");
  EXPECT_EQ(kiln::apps::human_bytes(1536.0), "1.5 KiB");
}

}  // namespace
