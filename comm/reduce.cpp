// reduce.cpp: the element-wise work of a reduction: dst += src, and buf *= factor (averaging),
// on the buffer's device. CPU: plain loops the compiler vectorises (OpenMP only for big
// buffers: below a few MB the threads cost more than they save, and on a 2-core box the other
// core is busy with backward); their CUDA twins are in reduce_cuda.cu. Each call ends with
// comm_finish: on a GPU a stream synchronization, because a transport's requests are not
// ordered with the GPU stream: the next send must not read the buffer before the kernel wrote
// it.
//
// Also the shared helpers of the algorithms (algo_util.h): scratch buffers and argument checks.
#include <cstdint>
#include <cstring>
#include <string>

#include "comm/algo_util.h"
#include "comm/algorithms.h"
#include "comm/reduce_kernels.h"
#include "engine/cuda/context.h"
#include "engine/dispatch.h"

namespace kiln::cpu {

constexpr int64_t kCommParallelThreshold = int64_t{1} << 20;  // elements

template <typename T>
void comm_reduce_into(Backend, T* dst, const T* src, int64_t n) {
  if (n >= kCommParallelThreshold) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = comm::add_elem(dst[i], src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = comm::add_elem(dst[i], src[i]);
  }
}

template <typename T>
void comm_scale(Backend, T* buf, int64_t n, double factor) {
  if (n >= kCommParallelThreshold) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) buf[i] = comm::scale_elem(buf[i], factor);
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = comm::scale_elem(buf[i], factor);
  }
}

void comm_copy(Backend, void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

template void comm_reduce_into<float>(Backend, float*, const float*, int64_t);
template void comm_reduce_into<double>(Backend, double*, const double*, int64_t);
template void comm_reduce_into<Half>(Backend, Half*, const Half*, int64_t);
template void comm_reduce_into<BFloat16>(Backend, BFloat16*, const BFloat16*, int64_t);
template void comm_scale<float>(Backend, float*, int64_t, double);
template void comm_scale<double>(Backend, double*, int64_t, double);
template void comm_scale<Half>(Backend, Half*, int64_t, double);
template void comm_scale<BFloat16>(Backend, BFloat16*, int64_t, double);

}  // namespace kiln::cpu

namespace kiln::comm {
namespace {

// Calls fn(T{}) with T the C++ type of the element type (f16, bf16: the engine's Half, BFloat16).
template <typename F>
void dispatch_elem(ElemType type, F&& fn) {
  switch (type) {
    case ElemType::F32: fn(float{}); return;
    case ElemType::F64: fn(double{}); return;
    case ElemType::F16: fn(Half{}); return;
    case ElemType::BF16: fn(BFloat16{}); return;
  }
  throw Error("comm: unknown element type", ErrorKind::Runtime);
}

}  // namespace

void reduce_into(const Buffer& dst, const Buffer& src) {
  KILN_CHECK(dst.type == src.type && dst.count == src.count && dst.device == src.device,
             "reduce_into: dst (", dst.count, " x ", elem_name(dst.type), " on ", dst.device.str(),
             ") and src (", src.count, " x ", elem_name(src.type), " on ", src.device.str(),
             ") must have the same type, count and device");
  if (dst.count == 0) return;
  dispatch_elem(dst.type, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(dst.data);
    const T* s = static_cast<const T*>(src.data);
    on_device("reduce_into", dst.device, [&](auto backend) {
      comm_reduce_into(backend, d, s, dst.count);
      comm_finish(backend);
    });
  });
}

void scale(const Buffer& buf, double factor) {
  if (buf.count == 0) return;
  dispatch_elem(buf.type, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(buf.data);
    on_device("comm::scale", buf.device, [&](auto backend) {
      comm_scale(backend, d, buf.count, factor);
      comm_finish(backend);
    });
  });
}

void copy_buffer(const Buffer& dst, const Buffer& src) {
  KILN_CHECK(dst.type == src.type && dst.count == src.count && dst.device == src.device,
             "copy_buffer: dst (", dst.count, " x ", elem_name(dst.type), " on ", dst.device.str(),
             ") and src (", src.count, " x ", elem_name(src.type), " on ", src.device.str(),
             ") must have the same type, count and device");
  if (dst.count == 0 || dst.data == src.data) return;
  on_device("comm::copy_buffer", dst.device, [&](auto backend) {
    comm_copy(backend, dst.data, src.data, dst.bytes());
    comm_finish(backend);
  });
}

Scratch::Scratch(ElemType type, int64_t count, Device device) {
  buf_.type = type;
  buf_.count = count;
  buf_.device = device;
  const size_t bytes = static_cast<size_t>(count) * elem_size(type);
  // From the engine's caching allocator, on the CPU too: a fresh std::vector per collective
  // would page-fault (and zero) megabytes every call; measured, that halved ring busbw at
  // 64-256 MiB.
  device_mem_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, device);
  buf_.data = device_mem_.raw_data();
}

void check_algorithm_args(const Transport& t, int n, const Buffer& buf, const char* what) {
  KILN_CHECK(n >= 1 && n <= t.size(), what, ": the member count ", n, " is not in [1, ",
             t.size(), "] (the transport's size)");
  KILN_CHECK(t.rank() < n, what, ": rank ", t.rank(), " is not a member (members are ranks 0..",
             n - 1, ")");
  KILN_CHECK(buf.count >= 0 && (buf.count == 0 || buf.data != nullptr), what,
             ": the buffer has no memory");
  KILN_CHECK(buf.device == t.device(), what, ": the ", t.name(), " transport moves buffers on ",
             t.device().str(), ", got one on ", buf.device.str());
}

}  // namespace kiln::comm
