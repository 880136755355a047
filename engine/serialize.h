// serialize.h: Kiln's checkpoint file: named tensors plus text metadata, validated on load.
//
// Layout (little-endian; offsets in bytes):
//   header (40 bytes)
//     0  char[8] magic "KILNCKPT"
//     8  u32     format version (1, or 2 when a tensor is f16 or bf16; see below)
//    12  u32     number of meta entries
//    16  u32     number of tensor records
//    20  u32     CRC32 of the table
//    24  u64     table length in bytes
//    32  u32     reserved (0)
//    36  u32     CRC32 of bytes 0..35
//   table (at 40)
//     per meta entry: u32 key length, key, u32 value length, value
//     per record:     u32 name length, name, u8 dtype (DType's value), u8 ndim, u16 reserved,
//                     i64 dims[ndim], u64 payload offset, u64 payload length, u32 payload CRC32
//   payloads: raw contiguous element bytes, each starting at a multiple of 64
//
// Writing is atomic: the file is written to path + ".tmp", fsynced, renamed over path, and
// the directory fsynced, so a crash leaves either the old checkpoint or the new one, never a
// torn one. A failed write (full disk, I/O error, file-size limit) throws a Runtime error naming
// the file and the errno text, removes the ".tmp" and leaves the old checkpoint untouched.
// Reading checks everything (magic, version, reserved fields, sizes, CRCs, bounds, payloads laid
// out back to back at 64-byte boundaries, no bytes after the last payload) and throws a
// kiln::Error of kind Input naming the file and, for a corrupt payload, the record.
// Test hook: KILN_CHECKPOINT_TEST_STALL_MS=<ms> in the environment makes write_checkpoint sleep
// that long with the ".tmp" half written, for crash tests (tools/kill_resume.sh).
// Tensors are saved from any device (copied to the host) and loaded on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "engine/tensor.h"

namespace kiln {

// Format versions. Version 2 is version 1 plus the dtypes F16 and BF16 (codes 5 and 6): a file
// is written as version 2 only when it holds such a tensor, so checkpoints of f32/f64/integer
// tensors stay readable by every Kiln, and a Kiln too old for f16/bf16 refuses a version-2 file
// by its version ("re-save it with a matching Kiln") instead of meeting an unknown dtype code.
// This build reads both.
constexpr uint32_t kCheckpointVersion = 2;       // the newest version this build reads and writes
constexpr uint32_t kCheckpointMinVersion = 1;    // the oldest it reads

struct Checkpoint {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta;  // e.g. "epoch", "step", "rng_offset", "model"
};

void write_checkpoint(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& meta = {});
Checkpoint read_checkpoint(const std::string& path);

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320; the same as zlib's crc32), continuing
// from `crc` so a buffer can be checksummed in pieces. crc32("123456789") == 0xCBF43926.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

}  // namespace kiln
