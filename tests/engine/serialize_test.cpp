// serialize_test.cpp: checkpoint round trips (f32/f64/i64/u8 tensors, meta), and every kind
// of damaged file giving a clear Input error that names the file (and the record, for a
// corrupt payload). The atomic write must leave no ".tmp" behind.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "engine/serialize.h"
#include "engine/tensor.h"
#include "support/file_bytes.h"

namespace kiln {
namespace {

using testing::read_bytes;
using testing::write_bytes;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + name; }

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// Expects read_checkpoint(path) to throw an Input error whose message contains every needle.
void expect_input_error(const std::string& path, const std::vector<std::string>& needles) {
  try {
    read_checkpoint(path);
    ADD_FAILURE() << "reading " << path << " should have failed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message lacks '" << n << "': " << e.what();
  }
}

std::map<std::string, Tensor> sample_tensors() {
  return {
      {"conv.weight", Tensor::from_vector(std::vector<float>{1.5f, -2.25f, 3.0f, 0.0f, 7.0f, -1e-30f},
                                          {1, 2, 3})},
      {"bn.running_var", Tensor::from_vector(std::vector<double>{0.1, 1e300, -3.5}, {3})},
      {"loader.position", Tensor::from_vector(std::vector<int64_t>{-1, int64_t{1} << 40}, {2, 1})},
      {"mask", Tensor::from_vector(std::vector<uint8_t>{0, 255, 7}, {3})},
      {"empty", Tensor::zeros({0, 5})},
  };
}

std::map<std::string, std::string> sample_meta() {
  return {{"epoch", "3"}, {"step", "1407"}, {"rng_offset", "123456789"}, {"model", "mnist_cnn"},
          {"note", std::string("binary \0 safe", 13)}};
}

TEST(Serialize, Crc32KnownValues) {
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32("", 0), 0u);
  // In pieces, the same as at once.
  EXPECT_EQ(crc32("6789", 4, crc32("12345", 5)), 0xCBF43926u);
}

TEST(Serialize, RoundTripKeepsEverythingAndLeavesNoTmp) {
  const std::string path = temp_path("roundtrip.kckpt");
  auto tensors = sample_tensors();
  write_checkpoint(path, tensors, sample_meta());
  EXPECT_FALSE(file_exists(path + ".tmp"));
  Checkpoint ck = read_checkpoint(path);
  EXPECT_EQ(ck.meta, sample_meta());
  ASSERT_EQ(ck.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    const Tensor& got = ck.tensors.at(name);
    EXPECT_EQ(got.dtype(), t.dtype());
    EXPECT_EQ(got.shape(), t.shape());
    EXPECT_TRUE(got.device().is_cpu());
    ASSERT_EQ(got.nbytes(), t.nbytes());
    EXPECT_EQ(std::memcmp(got.raw_data(), t.raw_data(), t.nbytes()), 0);  // bit for bit
  }
  // Overwriting an existing checkpoint works and is again atomic.
  write_checkpoint(path, {{"x", Tensor::ones({2})}}, {});
  EXPECT_EQ(read_checkpoint(path).tensors.size(), 1u);
  EXPECT_FALSE(file_exists(path + ".tmp"));
  std::remove(path.c_str());
}

TEST(Serialize, SavesTensorsFromAnotherCpuDevice) {
  const std::string path = temp_path("device.kckpt");
  Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}).to(Device("cpu:1"));
  write_checkpoint(path, {{"t", t}});
  Checkpoint ck = read_checkpoint(path);
  EXPECT_EQ(ck.tensors.at("t").device(), Device());
  EXPECT_EQ(ck.tensors.at("t").to_vector<float>(), (std::vector<float>{1, 2, 3}));
  std::remove(path.c_str());
}

TEST(Serialize, MissingFile) {
  expect_input_error(temp_path("no_such_checkpoint.kckpt"),
                     {"no_such_checkpoint.kckpt", "No such file"});
}

TEST(Serialize, BadMagic) {
  const std::string path = temp_path("bad_magic.kckpt");
  write_checkpoint(path, sample_tensors(), sample_meta());
  auto bytes = read_bytes(path);
  bytes[0] = 'X';
  write_bytes(path, bytes);
  expect_input_error(path, {"bad_magic.kckpt", "magic"});
  write_bytes(path, std::vector<char>(100, 'a'));  // not a checkpoint at all
  expect_input_error(path, {"bad_magic.kckpt", "magic"});
  std::remove(path.c_str());
}

TEST(Serialize, UnknownVersion) {
  const std::string path = temp_path("version.kckpt");
  write_checkpoint(path, sample_tensors());
  auto bytes = read_bytes(path);
  bytes[8] = 9;  // version field
  write_bytes(path, bytes);
  expect_input_error(path, {"version.kckpt", "version 9"});
  std::remove(path.c_str());
}

TEST(Serialize, FlippedPayloadByteNamesTheRecord) {
  const std::string path = temp_path("flipped.kckpt");
  Tensor big = Tensor::from_vector(std::vector<double>(100, 0.5), {10, 10});
  write_checkpoint(path, {{"a.small", Tensor::ones({2})}, {"z.big", big}});
  auto bytes = read_bytes(path);
  bytes[bytes.size() - 17] ^= 0x10;  // inside the last payload, "z.big"
  write_bytes(path, bytes);
  expect_input_error(path, {"flipped.kckpt", "'z.big'", "CRC"});
  std::remove(path.c_str());
}

TEST(Serialize, FlippedHeaderOrTableByteIsCaught) {
  const std::string path = temp_path("flipped_table.kckpt");
  write_checkpoint(path, sample_tensors(), sample_meta());
  const auto good = read_bytes(path);
  // Every byte of the header and the table matters (padding before payloads carries nothing).
  uint64_t table_bytes;
  std::memcpy(&table_bytes, good.data() + 24, 8);
  ASSERT_GT(table_bytes, 200u);
  for (size_t i = 0; i < 40 + table_bytes; ++i) {
    auto bytes = good;
    bytes[i] ^= 0x01;
    write_bytes(path, bytes);
    SCOPED_TRACE(i);
    expect_input_error(path, {"flipped_table.kckpt"});
  }
  std::remove(path.c_str());
}

TEST(Serialize, TruncatedAnywhereIsCaught) {
  const std::string path = temp_path("truncated.kckpt");
  write_checkpoint(path, sample_tensors(), sample_meta());
  const auto good = read_bytes(path);
  for (size_t len : {size_t{0}, size_t{7}, size_t{39}, size_t{40}, size_t{100}, good.size() / 2,
                     good.size() - 1}) {
    SCOPED_TRACE(len);
    write_bytes(path, std::vector<char>(good.begin(), good.begin() + static_cast<long>(len)));
    expect_input_error(path, {"truncated.kckpt"});
  }
  // Cut inside the last payload: the message says truncated.
  write_bytes(path, std::vector<char>(good.begin(), good.end() - 1));
  expect_input_error(path, {"truncated"});
  std::remove(path.c_str());
}

// Re-seals header and table CRCs after a deliberate edit, so the size checks themselves
// (not the CRCs) must catch the damage. Header layout: see engine/serialize.h.
void reseal(std::vector<char>& bytes) {
  uint64_t table_bytes;
  std::memcpy(&table_bytes, bytes.data() + 24, 8);
  if (table_bytes <= bytes.size() - 40) {
    uint32_t table_crc = crc32(bytes.data() + 40, table_bytes);
    std::memcpy(bytes.data() + 20, &table_crc, 4);
  }
  uint32_t header_crc = crc32(bytes.data(), 36);
  std::memcpy(bytes.data() + 36, &header_crc, 4);
}

TEST(Serialize, AbsurdSizesAreRejectedWithoutAllocating) {
  const std::string path = temp_path("absurd.kckpt");
  write_checkpoint(path, {{"t", Tensor::ones({3})}});
  const auto good = read_bytes(path);
  // The table length (offset 24) claims 2^60 bytes: must not try to allocate it.
  auto bytes = good;
  uint64_t huge = uint64_t{1} << 60;
  std::memcpy(bytes.data() + 24, &huge, 8);
  reseal(bytes);
  write_bytes(path, bytes);
  expect_input_error(path, {"absurd.kckpt", "truncated"});
  // The record count (offset 16) claims 2^31 records.
  bytes = good;
  uint32_t many = 1u << 31;
  std::memcpy(bytes.data() + 16, &many, 4);
  reseal(bytes);
  write_bytes(path, bytes);
  expect_input_error(path, {"absurd.kckpt", "absurd"});
  // The record's first dim (table: u32 name length, "t", dtype, ndim, u16 -> dims at 40 + 9)
  // claims 2^62 elements.
  bytes = good;
  int64_t dim = int64_t{1} << 62;
  std::memcpy(bytes.data() + 49, &dim, 8);
  reseal(bytes);
  write_bytes(path, bytes);
  expect_input_error(path, {"absurd.kckpt", "'t'", "absurd"});
  // The payload length no longer matches dtype x shape.
  bytes = good;
  int64_t four = 4;
  std::memcpy(bytes.data() + 49, &four, 8);
  reseal(bytes);
  write_bytes(path, bytes);
  expect_input_error(path, {"absurd.kckpt", "'t'", "payload bytes"});
  std::remove(path.c_str());
}

TEST(Serialize, TrailingBytesAreRejectedWithTheirCount) {
  const std::string path = temp_path("trailing.kckpt");
  write_checkpoint(path, sample_tensors(), sample_meta());
  auto bytes = read_bytes(path);
  const size_t size = bytes.size();
  bytes.insert(bytes.end(), {'x', 'y', 'z'});  // appended after the last payload
  write_bytes(path, bytes);
  expect_input_error(path, {"trailing.kckpt", "3 trailing bytes", std::to_string(size)});
  // A checkpoint without records: its table is the end.
  write_checkpoint(path, {}, sample_meta());
  bytes = read_bytes(path);
  bytes.push_back('\0');
  write_bytes(path, bytes);
  expect_input_error(path, {"trailing.kckpt", "1 trailing bytes"});
  std::remove(path.c_str());
}

TEST(Serialize, ReservedFieldsAndPayloadLayoutAreChecked) {
  const std::string path = temp_path("layout.kckpt");
  write_checkpoint(path, {{"a", Tensor::ones({3})}, {"b", Tensor::ones({2})}});
  const auto good = read_bytes(path);
  // The header's reserved u32 (offset 32), set and resealed.
  auto bytes = good;
  bytes[32] = 1;
  reseal(bytes);
  write_bytes(path, bytes);
  expect_input_error(path, {"layout.kckpt", "reserved header field"});
  // Record "a"'s reserved u16 (table at 40: u32 name length, "a", dtype, ndim, u16).
  bytes = good;
  bytes[40 + 4 + 1 + 2] = 7;
  reseal(bytes);
  write_bytes(path, bytes);
  expect_input_error(path, {"layout.kckpt", "'a'", "reserved field"});
  // Record "b"'s payload offset moved onto "a"'s payload (overlapping payloads; the CRC of "b"
  // still matches since both hold ones): table record a = 4+1+1+1+2+8 dims+8+8+4 = 37 bytes,
  // then b's offset at 37 + 4+1+1+1+2+8.
  bytes = good;
  const size_t a_offset_at = 40 + 4 + 1 + 4 + 8, b_offset_at = 40 + 37 + 4 + 1 + 4 + 8;
  uint64_t a_offset;
  std::memcpy(&a_offset, bytes.data() + a_offset_at, 8);
  std::memcpy(bytes.data() + b_offset_at, &a_offset, 8);
  reseal(bytes);
  write_bytes(path, bytes);
  expect_input_error(path, {"layout.kckpt", "'b'", "payload starts at byte"});
  std::remove(path.c_str());
}

// A write that fails part way (here: the file-size limit, the same code path as a full disk)
// throws an error naming the file and the errno text, removes the ".tmp", and leaves the
// previous checkpoint as it was. Runs in a child process, which alone gets the small limit.
TEST(Serialize, FailedWriteKeepsThePreviousCheckpointAndRemovesTheTmp) {
  const std::string path = temp_path("fsize.kckpt");
  std::remove((path + ".tmp").c_str());
  write_checkpoint(path, {{"small", Tensor::ones({4})}}, {{"which", "old"}});
  const auto old_bytes = read_bytes(path);
  ASSERT_LT(old_bytes.size(), 4096u);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: exit code 0 only when the write failed as it should.
    std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of a signal
    struct rlimit lim = {4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    try {
      write_checkpoint(path, {{"big", Tensor::ones({1 << 16})}}, {{"which", "new"}});
      ::_exit(11);  // the 256 KiB write should not have succeeded
    } catch (const Error& e) {
      const std::string m = e.what();
      if (m.find("fsize.kckpt") == std::string::npos) ::_exit(12);
      if (m.find(std::strerror(EFBIG)) == std::string::npos) ::_exit(13);
      if (e.kind() != ErrorKind::Runtime) ::_exit(14);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setrlimit failed, 11: the write succeeded, 12: the "
                                       "message lacks the file, 13: lacks strerror(EFBIG), 14: "
                                       "not a Runtime error";
  EXPECT_FALSE(file_exists(path + ".tmp")) << "the failed write left its .tmp behind";
  EXPECT_EQ(read_bytes(path), old_bytes) << "the previous checkpoint was changed";
  EXPECT_EQ(read_checkpoint(path).meta.at("which"), "old");
  std::remove(path.c_str());
}

TEST(Serialize, WriteToMissingDirectoryFailsClearly) {
  const std::string path = temp_path("no_such_dir/ck.kckpt");
  try {
    write_checkpoint(path, {{"t", Tensor::ones({1})}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_dir"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln

