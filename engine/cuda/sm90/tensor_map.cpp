// sm90/tensor_map.cpp: encode_tma_2d under nvcc (sm90/tma.h). The driver's
// cuTensorMapEncodeTiled is looked up through the runtime (cudaGetDriverEntryPointByVersion),
// so Kiln does not link libcuda. The rules are checked here first, so a bad map is a
// kiln::Error naming the rule rather than the driver's bare CUDA_ERROR_INVALID_VALUE.
// (The simulator's encoder is engine/cuda/sim/sm90_tma.cpp; this file is built only with CUDA.)
#include "engine/cuda/sm90/tma.h"

#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

#include "engine/error.h"

namespace kiln::cuda::sm90 {

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error("kiln::cuda::sm90::encode_tma_2d: " + what + " (cuTensorMapEncodeTiled's rules)",
              ErrorKind::Usage);
}

PFN_cuTensorMapEncodeTiled_v12000 driver_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr)
      throw Error("kiln::cuda::sm90::encode_tma_2d: the CUDA driver has no cuTensorMapEncodeTiled "
                  "(a driver for CUDA 12.0 or later is needed)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

CUtensorMapSwizzle driver_swizzle(Swizzle s) {
  switch (s) {
    case Swizzle::B32: return CU_TENSOR_MAP_SWIZZLE_32B;
    case Swizzle::B64: return CU_TENSOR_MAP_SWIZZLE_64B;
    case Swizzle::B128: return CU_TENSOR_MAP_SWIZZLE_128B;
    case Swizzle::None: break;
  }
  return CU_TENSOR_MAP_SWIZZLE_NONE;
}

}  // namespace

void encode_tma_2d(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                   uint64_t row_stride_bytes, uint32_t box_rows, uint32_t box_cols,
                   Swizzle swizzle) {
  constexpr uint32_t kElemBytes = 2;
  if (map == nullptr || reinterpret_cast<uintptr_t>(map) % 64 != 0)
    fail("the tensor map's address must be 64-byte aligned");
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0)
    fail("the global address must be 16-byte aligned");
  if (rows == 0 || cols == 0 || rows > (1ull << 32) || cols > (1ull << 32))
    fail("the tensor's dimensions must each be in [1, 2^32]");
  if (row_stride_bytes % 16 != 0 || row_stride_bytes >= (1ull << 40))
    fail("the row stride " + std::to_string(row_stride_bytes) +
         " bytes must be a multiple of 16 and below 2^40");
  if (row_stride_bytes < cols * kElemBytes)
    fail("the row stride " + std::to_string(row_stride_bytes) + " bytes is shorter than a row");
  if (box_rows == 0 || box_cols == 0 || box_rows > 256 || box_cols > 256)
    fail("the box dimensions must each be in [1, 256]");
  const uint32_t inner_bytes = box_cols * kElemBytes;
  if (inner_bytes % 16 != 0) fail("the box's inner dimension must be a multiple of 16 bytes");
  if (swizzle != Swizzle::None && inner_bytes > swizzle_row_bytes(swizzle))
    fail("the box's inner dimension (" + std::to_string(inner_bytes) +
         " bytes) must not exceed the swizzle span (" + std::to_string(swizzle_row_bytes(swizzle)) +
         " bytes)");
  // Dimensions innermost first: columns, then rows; the innermost stride is implied.
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = driver_encoder()(
      map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(base), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, driver_swizzle(swizzle),
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("kiln::cuda::sm90::encode_tma_2d: cuTensorMapEncodeTiled failed (CUresult " +
                std::to_string(static_cast<int>(r)) + ")");
}

}  // namespace kiln::cuda::sm90
