// dispatch.h: how an op calls its kernel pair. Every kernel has twins of one name and one
// signature, one in kiln::cpu and one in kiln::cuda, whose first parameter is their backend's
// tag (cpu::Backend or cuda::Backend). An op calls
//
//   run_kernel("leaky_relu", x.device(), x.dtype(), [&](auto backend, auto tag) {
//     using T = typename decltype(tag)::type;
//     leaky_relu_forward(backend, x.data<T>(), y.data<T>(), x.numel(), T(negative_slope));
//   });
//
// run_kernel picks the backend from the device (under a cuda::DeviceGuard for a CUDA device)
// and T from the dtype (f32 or f64, dispatch_floating); the unqualified call then finds
// cpu::leaky_relu_forward or cuda::leaky_relu_forward by the type of `backend`
// (argument-dependent lookup: the namespace of an argument's type is searched). Because the
// call is unqualified, the twins' other arguments must let the compiler deduce T (pass T(...)
// for scalars); a kernel that is not a template works the same way.
//
// In a build without a CUDA backend a CUDA tensor gets no_cuda_backend(op): the CUDA branch sits
// in the discarded arm of `if constexpr`, so the lambda is never compiled for cuda::Backend and
// the CUDA twins (declared in every build) need no definition.
#pragma once

#include <string>

#include "engine/backend.h"
#include "engine/build_config.h"
#include "engine/cuda/context.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/error.h"

namespace kiln {

// What an op says on a CUDA tensor when the CUDA backend is not built in.
[[noreturn]] inline void no_cuda_backend(const char* op) {
  throw Error(std::string(op) + ": this build of Kiln has no CUDA backend; use --device cpu");
}

// Calls fn(cpu::Backend{}) for a CPU device, fn(cuda::Backend{}) under a DeviceGuard for a CUDA
// one. For kernels that are not templated on a floating dtype (copies, integer data, 16-bit
// inputs); run_kernel below adds the dtype.
template <typename Fn>
void on_device(const char* op, Device device, Fn&& fn) {
  if (device.type == DeviceType::CPU) {
    fn(cpu::Backend{});
    return;
  }
  if constexpr (kWithCuda) {
    cuda::DeviceGuard guard(device.index);
    fn(cuda::Backend{});
  } else {
    no_cuda_backend(op);
  }
}

// Calls fn(backend, TypeTag<T>{}) with the backend of `device` and T the element type of
// `dtype` (float or double; other dtypes are an error naming `op`).
template <typename Fn>
void run_kernel(const char* op, Device device, DType dtype, Fn&& fn) {
  on_device(op, device, [&](auto backend) {
    dispatch_floating(dtype, op, [&](auto tag) { fn(backend, tag); });
  });
}

// run_kernel for the kernels that also take 16-bit activations: T is float, double, Half or
// BFloat16 (dispatch_activation); such a kernel computes in compute_t<T>.
template <typename Fn>
void run_activation_kernel(const char* op, Device device, DType dtype, Fn&& fn) {
  on_device(op, device, [&](auto backend) {
    dispatch_activation(dtype, op, [&](auto tag) { fn(backend, tag); });
  });
}

}  // namespace kiln
