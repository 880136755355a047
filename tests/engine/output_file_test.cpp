// output_file_test: kiln::write_output_file (engine/output_file.h) replaces a file whole, keeps a
// symbolic link a link, and a write that fails (here past RLIMIT_FSIZE, with SIGXFSZ ignored as
// every app ignores it) throws a Runtime error in words, leaves the old bytes and no temporary
// file.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "engine/error.h"
#include "engine/output_file.h"
#include "support/file_bytes.h"

namespace {

namespace fs = std::filesystem;

class OutputFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("kiln_output_file_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string text_of(const std::string& p) const {
    const std::vector<char> bytes = kiln::testing::read_bytes(p);
    return std::string(bytes.begin(), bytes.end());
  }
  // Only `expected` files in the directory: no temporary left behind.
  void expect_entries(size_t expected) const {
    size_t n = 0;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      ++n;
      EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
    }
    EXPECT_EQ(n, expected);
  }
  fs::path dir_;
};

TEST_F(OutputFile, WritesANewFileAndReplacesAnOldOne) {
  kiln::write_output_file("--json", path("a.json"), "first\n");
  EXPECT_EQ(text_of(path("a.json")), "first\n");
  kiln::write_output_file("--json", path("a.json"), "second, longer\n");
  EXPECT_EQ(text_of(path("a.json")), "second, longer\n");
  kiln::write_output_file("--json", path("a.json"), "");
  EXPECT_EQ(text_of(path("a.json")), "");
  expect_entries(1);
}

TEST_F(OutputFile, ASymbolicLinkStaysALinkAndItsTargetIsReplaced) {
  kiln::write_output_file("--json", path("target.json"), "old\n");
  fs::create_symlink("target.json", path("link.json"));
  kiln::write_output_file("--json", path("link.json"), "new\n");
  EXPECT_TRUE(fs::is_symlink(path("link.json")));
  EXPECT_EQ(text_of(path("target.json")), "new\n");
  expect_entries(2);
}

TEST_F(OutputFile, AFailedWriteSaysWhyAndKeepsTheOldBytes) {
  kiln::write_output_file("--json", path("run.json"), "the previous run\n");
  kiln::ignore_file_size_signal();
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit limited = saved;
  limited.rlim_cur = 4;  // bytes: the new file's fifth byte fails with EFBIG
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string message;
  kiln::ErrorKind kind = kiln::ErrorKind::Usage;
  try {
    kiln::write_output_file("--json", path("run.json"), "a summary longer than four bytes\n");
  } catch (const kiln::Error& e) {
    message = e.what();
    kind = e.kind();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  EXPECT_EQ(kind, kiln::ErrorKind::Runtime) << message;
  EXPECT_NE(message.find("--json " + path("run.json") + ": writing failed: File too large"),
            std::string::npos) << message;
  EXPECT_NE(message.find("the previous " + path("run.json") + " is left as it was"),
            std::string::npos) << message;
  EXPECT_EQ(text_of(path("run.json")), "the previous run\n");
  expect_entries(1);
}

TEST_F(OutputFile, AMissingDirectoryIsAnErrorNamingTheFile) {
  const std::string p = path("no_such_dir/run.json");
  try {
    kiln::write_output_file("the trace", p, "{}\n");
    FAIL() << "writing into a missing directory did not throw";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the trace " + p + ": creating a new file in its "
                                         "directory failed: No such file or directory"),
              std::string::npos) << e.what();
  }
}

}  // namespace
