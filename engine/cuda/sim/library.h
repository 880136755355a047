// sim/library.h: what the simulated vendor libraries (sim/cublas.cpp, sim/cudnn*.cpp) share:
// the reason for the last failed call, the device-memory range checks, TF32 rounding.
// TF32 rounds a float to 10 mantissa bits, to nearest, as cuBLAS's CUBLAS_COMPUTE_32F_FAST_TF32
// and cuDNN's CUDNN_TENSOR_OP_MATH do for float inputs (https://docs.nvidia.com/cuda/cublas/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "engine/cuda/sim/api.h"

namespace kiln::sim {

// Records why this thread's current library call fails (read by last_library_error(),
// sim/cublas.h) and returns `status`, so a check reads `return library_fail(BAD, "...")`.
void set_library_error(std::string why);
void clear_library_error();
template <typename Status>
Status library_fail(Status status, std::string why) {
  set_library_error(std::move(why));
  return status;
}

// Whether [p, p + bytes) lies inside ONE live cudaMalloc allocation of `device`; if not, `why`
// says what is wrong ("A: 16 bytes past the end of its allocation of 64 bytes"), naming the
// operand `what`. bytes == 0 is always fine (nothing is touched). The allocation is the
// caching allocator's block (or segment), so a range that spills into a neighbouring tensor of
// the same block is not caught here; AddressSanitizer trees catch it in the poisoned slack.
bool device_range_ok(const char* what, const void* p, size_t bytes, int device, std::string* why);
// The same check where the work runs (on the stream): the memory may have been freed between
// the call and its turn. Throws kiln::Error, which becomes the device's sticky fault.
void require_device_range(const char* call, const char* what, const void* p, size_t bytes,
                          int device);

// Elements a column-major rows x cols matrix with leading dimension ld spans, from its first
// element to its last (A[(cols-1)*ld + rows-1]); 0 when it is empty.
inline int64_t matrix_span(int64_t rows, int64_t cols, int64_t ld) {
  return rows > 0 && cols > 0 ? (cols - 1) * ld + rows : 0;
}

// Why `stream` cannot take a library call of a handle of `device` (empty when it can): it was
// destroyed, or belongs to another device, or the current device is not the handle's.
std::string stream_problem(cudaStream_t stream, int device);

// FP32 -> TF32 as tensor cores read it: 10 explicit mantissa bits, rounded to nearest with ties
// away from zero (PTX cvt.rna.tf32.f32). NaN and infinity pass through.
float round_tf32(float x);

}  // namespace kiln::sim
