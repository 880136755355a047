// dispatch.h: small helpers shared by the op files (not part of the public API).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/build_config.h"
#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/tensor.h"

namespace kiln {

// What an op says on a CUDA tensor until the CUDA backend is built in.
[[noreturn]] inline void no_cuda_backend(const char* op) {
  throw Error(std::string(op) + ": this build of Kiln has no CUDA backend; use --device cpu");
}

// The device switch of an op: runs on_cpu() for a tensor on the CPU, and on_cuda() under a
// cuda::DeviceGuard for one on a CUDA device. The dtype switch (dispatch_floating) goes inside:
//
//   on_device("relu_backward", g.device(),
//       [&] { dispatch_floating(g.dtype(), "relu_backward", [&](auto tag) { cpu::... }); },
//       [&] { dispatch_floating(g.dtype(), "relu_backward", [&](auto tag) { cuda::... }); });
//
// In a build without a CUDA backend a CUDA tensor gets no_cuda_backend(op). There on_cuda() sits
// in the discarded branch of `if constexpr`, so it is never compiled into a call: no code is
// emitted for it, and the CUDA kernels it names (declared in every build) need no definition.
template <typename OnCpu, typename OnCuda>
void on_device(const char* op, Device device, OnCpu&& on_cpu, OnCuda&& on_cuda) {
  if (device.type == DeviceType::CPU) {
    on_cpu();
    return;
  }
  if constexpr (kWithCuda) {
    cuda::DeviceGuard guard(device.index);
    on_cuda();
  } else {
    no_cuda_backend(op);
  }
}

// (outer, len, inner) view of `shape` around dim d: the layout every dim-wise kernel uses.
struct DimSplit {
  int64_t outer = 1, len = 1, inner = 1;
};
inline DimSplit split_at(const Shape& shape, int64_t d) {
  DimSplit s;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i < d) s.outer *= shape[static_cast<size_t>(i)];
    else if (i == d) s.len = shape[static_cast<size_t>(i)];
    else s.inner *= shape[static_cast<size_t>(i)];
  }
  return s;
}

}  // namespace kiln
