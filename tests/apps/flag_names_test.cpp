// flag_names_test: the rewriting of old flag spellings (apps/common/flag_names.h): renamed flags
// in both forms (--old v, --old=v), a switch that became a value, renamed values alone and in
// comma lists, nothing after "--", one line per rewrite and none when quiet.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/common/flag_names.h"

namespace kiln::apps {
namespace {

const std::vector<OldSpelling> kOld = {renamed_flag("--transport", "--dist"),
                                       renamed_flag("--dtypes", "--precision"),
                                       renamed_value("--precision", "f16", "fp16"),
                                       switch_to_value("--tf32", "--precision", "tf32")};

// Rewrites `args` (argv[0] "app" prepended) and returns the words after argv[0]; `said` gets
// what went to stderr.
std::vector<std::string> rewrite(std::vector<std::string> args, std::string* said = nullptr,
                                 bool quiet = false) {
  args.insert(args.begin(), "app");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  ::testing::internal::CaptureStderr();
  std::vector<std::string> out =
      rewrite_old_spellings(static_cast<int>(argv.size()), argv.data(), kOld, "app", quiet);
  const std::string err = ::testing::internal::GetCapturedStderr();
  if (said != nullptr) *said = err;
  EXPECT_EQ(out.front(), "app");
  out.erase(out.begin());
  return out;
}

using Words = std::vector<std::string>;

TEST(FlagNames, NewSpellingsPassUntouchedAndSilently) {
  std::string said;
  EXPECT_EQ(rewrite({"--dist", "local:2", "--precision", "bf16,fp16", "--csv", "x"}, &said),
            (Words{"--dist", "local:2", "--precision", "bf16,fp16", "--csv", "x"}));
  EXPECT_EQ(said, "");
}

TEST(FlagNames, RenamedFlagInBothForms) {
  std::string said;
  EXPECT_EQ(rewrite({"--transport", "local:4", "--iters", "1"}, &said),
            (Words{"--dist", "local:4", "--iters", "1"}));
  EXPECT_EQ(said, "app: --transport local:4 is deprecated: write --dist local:4\n");
  EXPECT_EQ(rewrite({"--transport=mpi"}, &said), (Words{"--dist=mpi"}));
  EXPECT_EQ(said, "app: --transport=mpi is deprecated: write --dist=mpi\n");
}

TEST(FlagNames, RenamedValuesInAListAndUnderTheNewName) {
  std::string said;
  EXPECT_EQ(rewrite({"--dtypes", "bf16,f16"}, &said), (Words{"--precision", "bf16,fp16"}));
  EXPECT_EQ(said, "app: --dtypes bf16,f16 is deprecated: write --precision bf16,fp16\n");
  EXPECT_EQ(rewrite({"--precision", "f16"}, &said), (Words{"--precision", "fp16"}));
  EXPECT_EQ(said, "app: --precision f16 is deprecated: write --precision fp16\n");
  // A value that is not an old spelling stays, for the new flag's check to refuse in words.
  EXPECT_EQ(rewrite({"--dtypes", "f8"}, &said), (Words{"--precision", "f8"}));
}

TEST(FlagNames, SwitchBecomesFlagAndValue) {
  std::string said;
  EXPECT_EQ(rewrite({"--tf32", "--steps", "3"}, &said),
            (Words{"--precision", "tf32", "--steps", "3"}));
  EXPECT_EQ(said, "app: --tf32 is deprecated: write --precision tf32\n");
}

TEST(FlagNames, NothingAfterDoubleDashAndNothingSaidWhenQuiet) {
  EXPECT_EQ(rewrite({"--", "--transport", "x"}), (Words{"--", "--transport", "x"}));
  std::string said;
  EXPECT_EQ(rewrite({"--transport", "mpi"}, &said, /*quiet=*/true), (Words{"--dist", "mpi"}));
  EXPECT_EQ(said, "");
  // A renamed flag with its value missing keeps the new name, so CLI11 says what is missing.
  EXPECT_EQ(rewrite({"--transport"}), (Words{"--dist"}));
}

}  // namespace
}  // namespace kiln::apps
