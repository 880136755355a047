// checkpoint_reader.cpp: fuzz target for the checkpoint reader (engine/serialize.h) and the
// training checkpoint's metadata parsing on top of it (apps/common/train_checkpoint.h).
//
// The input is a checkpoint file. It is read as it is, and then, because a random mutation
// almost never keeps the header's and the table's CRC32s right (so the reader would stop at the
// CRC checks every time), once more with those two CRCs recomputed: that copy reaches the table
// parser and the per-record checks. A checkpoint that reads is also read as a training
// checkpoint, expecting the model and optimizer names it holds, so its metadata parsing runs
// too, and its counts and positions must not be negative. An Input error is the expected
// answer to a bad file.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "apps/common/train_checkpoint.h"
#include "engine/error.h"
#include "engine/serialize.h"
#include "memory_file.h"

namespace {

constexpr size_t kHeaderBytes = 40;

std::string meta_or_empty(const kiln::Checkpoint& c, const char* key) {
  const auto it = c.meta.find(key);
  return it == c.meta.end() ? std::string() : it->second;
}

void read_both_ways(const uint8_t* data, size_t size) {
  const kiln::fuzz::MemoryFile file(data, size);
  kiln::Checkpoint ck;
  try {
    ck = kiln::read_checkpoint(file.path());
  } catch (const kiln::Error& e) {
    if (e.kind() != kiln::ErrorKind::Input) std::abort();
    return;
  }
  for (const auto& [name, t] : ck.tensors) {
    if (!t.defined() || t.nbytes() > size) std::abort();
  }
  try {
    const kiln::apps::TrainCheckpoint train = kiln::apps::read_train_checkpoint(
        file.path(), meta_or_empty(ck, "model"), meta_or_empty(ck, "optimizer"));
    // Where a resumed run starts counting: no negative count or position (global_step -1:
    // not recorded, in kiln-train/1 files).
    if (train.epoch < 0 || train.epoch_position < 0 || train.global_step < -1 ||
        train.epoch_steps < 0 || train.epoch_seen < 0 || train.workers < 1) {
      std::abort();
    }
  } catch (const kiln::Error& e) {
    if (e.kind() != kiln::ErrorKind::Input) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  read_both_ways(data, size);
  if (size < kHeaderBytes) return 0;
  // The same bytes with the table CRC (bytes 20..23, over the table_bytes bytes after the header
  // when the file holds them) and the header CRC (bytes 36..39, over bytes 0..35) made right.
  std::vector<uint8_t> fixed(data, data + size);
  uint64_t table_bytes = 0;
  std::memcpy(&table_bytes, fixed.data() + 24, sizeof(table_bytes));
  if (table_bytes <= size - kHeaderBytes) {
    const uint32_t table_crc = kiln::crc32(fixed.data() + kHeaderBytes, table_bytes);
    std::memcpy(fixed.data() + 20, &table_crc, sizeof(table_crc));
  }
  const uint32_t header_crc = kiln::crc32(fixed.data(), kHeaderBytes - 4);
  std::memcpy(fixed.data() + kHeaderBytes - 4, &header_crc, sizeof(header_crc));
  if (std::memcmp(fixed.data(), data, kHeaderBytes) != 0) read_both_ways(fixed.data(), size);
  return 0;
}
