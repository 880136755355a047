// sim/sm90_tma.cpp: the simulator's tensor maps and TMA loads (the model: sim/sm90_tma.h).
#include "engine/cuda/sim/sm90_tma.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/sim/scheduler.h"
#include "engine/cuda/sim/sm90_mbarrier.h"
#include "engine/error.h"
#include "engine/sanitizer.h"

namespace kiln::sim::sm90 {

namespace {

using ::kiln::cuda::sm90::Swizzle;
using ::kiln::cuda::sm90::swizzle_address;
using ::kiln::cuda::sm90::swizzle_atom_bytes;
using ::kiln::cuda::sm90::swizzle_row_bytes;

constexpr unsigned long long kTag = 0x4b494c4e544d4150ull;  // "KILNTMAP"

// The fields the encoder stores in CUtensorMap::opaque.
struct Fields {
  unsigned long long tag;
  const unsigned char* base;
  uint64_t rows, cols, row_stride_bytes;
  uint32_t box_rows, box_cols, elem_bytes;
  Swizzle swizzle;
};
static_assert(sizeof(Fields) <= sizeof(CUtensorMap), "the fields must fit the opaque words");

const char* swizzle_name(Swizzle s) {
  return s == Swizzle::B32 ? "CU_TENSOR_MAP_SWIZZLE_32B"
         : s == Swizzle::B64 ? "CU_TENSOR_MAP_SWIZZLE_64B"
         : s == Swizzle::B128 ? "CU_TENSOR_MAP_SWIZZLE_128B"
                              : "CU_TENSOR_MAP_SWIZZLE_NONE";
}

[[noreturn]] void encode_fail(const std::string& what) {
  throw Error("kiln::cuda::sm90::encode_tma_2d: " + what + " (cuTensorMapEncodeTiled's rules)",
              ErrorKind::Usage);
}

[[noreturn]] void load_fail(const std::string& what) {
  throw Error("kiln::cuda::sm90::tma_load_2d: " + what);
}

std::string address(const void* p) {
  char s[32];
  std::snprintf(s, sizeof s, "%p", p);
  return s;
}

}  // namespace

void encode_tiled_2d(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                     uint64_t row_stride_bytes, uint32_t box_rows, uint32_t box_cols,
                     uint32_t elem_bytes, Swizzle swizzle) {
  if (map == nullptr || reinterpret_cast<uintptr_t>(map) % 64 != 0)
    encode_fail("the tensor map's address must be 64-byte aligned");
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0)
    encode_fail("the global address " + address(base) + " must be 16-byte aligned");
  if (rows == 0 || cols == 0 || rows > (1ull << 32) || cols > (1ull << 32))
    encode_fail("the tensor's dimensions " + std::to_string(rows) + " x " + std::to_string(cols) +
                " must each be in [1, 2^32]");
  if (row_stride_bytes % 16 != 0)
    encode_fail("the row stride " + std::to_string(row_stride_bytes) +
                " bytes must be a multiple of 16");
  if (row_stride_bytes >= (1ull << 40))
    encode_fail("the row stride " + std::to_string(row_stride_bytes) + " bytes must be below 2^40");
  if (row_stride_bytes < cols * elem_bytes)
    encode_fail("the row stride " + std::to_string(row_stride_bytes) + " bytes is shorter than a row (" +
                std::to_string(cols * elem_bytes) + " bytes): rows would overlap");
  if (box_rows == 0 || box_cols == 0 || box_rows > 256 || box_cols > 256)
    encode_fail("the box " + std::to_string(box_rows) + " x " + std::to_string(box_cols) +
                " must have each dimension in [1, 256]");
  const uint32_t inner_bytes = box_cols * elem_bytes;
  if (inner_bytes % 16 != 0)
    encode_fail("the box's inner dimension (" + std::to_string(box_cols) + " elements, " +
                std::to_string(inner_bytes) + " bytes) must be a multiple of 16 bytes");
  if (swizzle != Swizzle::None && inner_bytes > swizzle_row_bytes(swizzle))
    encode_fail("the box's inner dimension (" + std::to_string(inner_bytes) +
                " bytes) must not exceed the swizzle span of " + swizzle_name(swizzle) + " (" +
                std::to_string(swizzle_row_bytes(swizzle)) + " bytes)");
  // Narrower swizzled boxes are valid on a GPU, but where their rows land is not modelled here.
  if (swizzle != Swizzle::None && inner_bytes != swizzle_row_bytes(swizzle))
    encode_fail("the simulator models a swizzled box only when its inner dimension is the whole "
                "swizzle span: " + std::to_string(inner_bytes) + " bytes, " + swizzle_name(swizzle) +
                " needs " + std::to_string(swizzle_row_bytes(swizzle)));
  const Fields f{kTag, static_cast<const unsigned char*>(base), rows, cols, row_stride_bytes,
                 box_rows, box_cols, elem_bytes, swizzle};
  std::memset(map, 0, sizeof *map);
  std::memcpy(map, &f, sizeof f);
}

void tma_load_2d(void* dst, const CUtensorMap* map, int32_t row, int32_t col, void* bar) {
  if (!inside_kernel()) load_fail("called outside a kernel");
  if (map == nullptr || reinterpret_cast<uintptr_t>(map) % 64 != 0)
    load_fail("the tensor map pointer " + address(map) + " must be 64-byte aligned (pass &map "
              "of the kernel's `const __grid_constant__ CUtensorMap map` parameter)");
  Fields f;
  std::memcpy(&f, map, sizeof f);
  if (f.tag != kTag)
    load_fail("the tensor map at " + address(map) + " was not made by encode_tma_2d");
  const uint32_t box_bytes = f.box_rows * f.box_cols * f.elem_bytes;
  const uint32_t align = f.swizzle == Swizzle::None ? 128u : swizzle_atom_bytes(f.swizzle) < 128u
                                                                 ? 128u
                                                                 : swizzle_atom_bytes(f.swizzle);
  if (reinterpret_cast<uintptr_t>(dst) % align != 0)
    load_fail("the shared-memory destination " + address(dst) + " must be " +
              std::to_string(align) + "-byte aligned (128 bytes at least, and the swizzle atom "
              "of " + swizzle_name(f.swizzle) + ", whose pattern follows the address bits)");
  if (!in_shared_memory(dst, box_bytes))
    load_fail("the destination " + address(dst) + " .. +" + std::to_string(box_bytes) +
              " bytes must lie in the block's shared memory");
  // Read the box now (out-of-bounds elements zero), at the swizzled offsets the data will land.
  std::vector<unsigned char> bytes(box_bytes, 0);
  for (uint32_t r = 0; r < f.box_rows; ++r) {
    const int64_t gr = static_cast<int64_t>(row) + r;
    for (uint32_t c = 0; c < f.box_cols; ++c) {
      const int64_t gc = static_cast<int64_t>(col) + c;
      if (gr < 0 || gc < 0 || static_cast<uint64_t>(gr) >= f.rows || static_cast<uint64_t>(gc) >= f.cols)
        continue;
      const uint32_t offset = (r * f.box_cols + c) * f.elem_bytes;
      std::memcpy(&bytes[swizzle_address(f.swizzle, offset)],
                  f.base + static_cast<uint64_t>(gr) * f.row_stride_bytes + static_cast<uint64_t>(gc) * f.elem_bytes,
                  f.elem_bytes);
    }
  }
  KILN_TSAN_IGNORE_WRITES_BEGIN();
  std::memset(dst, 0xFF, box_bytes);
  KILN_TSAN_IGNORE_WRITES_END();
  mbarrier_add_copy(bar, static_cast<unsigned char*>(dst), std::move(bytes),
                    "tma_load_2d");
}

}  // namespace kiln::sim::sm90
