// tensor.cpp: Storage and Tensor: factories, views, copies between devices and dtypes, autograd plumbing.
#include "engine/tensor.h"

#include <cstdint>
#include <cstring>
#include <sstream>
#include <utility>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/convert_cpu.h"
#include "engine/cuda/context.h"
#include "engine/cuda/kernels/copy.h"
#include "engine/cuda/tensor_copy.h"
#include "engine/error.h"
#include "engine/memory_format.h"
#if KILN_WITH_CUDA  // the allocators' headers name CUDA runtime types
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/pinned_allocator.h"
#endif

namespace kiln {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// ---- Storage ----------------------------------------------------------------------------------

#if !KILN_WITH_CUDA
[[noreturn]] static void no_cuda(const char* what) {
  throw Error(std::string(what) + ": this build of Kiln has no CUDA backend; use --device cpu",
              ErrorKind::Usage);
}
#endif

Storage::Storage(size_t nbytes, Device dev)
    : Storage(nbytes, dev, dev.is_cuda() ? MemoryKind::Device : MemoryKind::Host) {}

Storage::Storage(size_t nbytes, Device dev, MemoryKind k) : bytes(nbytes), device(dev), kind(k) {
  KILN_CHECK(dev.is_cuda() == (k == MemoryKind::Device), "Storage: memory kind does not match ",
             dev.str());
  switch (kind) {
    case MemoryKind::Host: data = cpu_allocator::allocate(nbytes, dev.index); break;
    case MemoryKind::PinnedHost:
#if KILN_WITH_CUDA
      data = pinned_allocator::allocate(nbytes);
#else
      no_cuda("pinned host memory");
#endif
      break;
    case MemoryKind::Device:
      cuda::check_device(dev.index);  // a Usage error naming the devices that exist
#if KILN_WITH_CUDA
      data = cuda_allocator::allocate(nbytes, dev.index);
#endif
      break;
  }
}

Storage::Storage(void* block, size_t nbytes, Device dev, MemoryKind k)
    : data(block), bytes(nbytes), device(dev), kind(k) {
  KILN_CHECK(dev.is_cuda() == (k == MemoryKind::Device), "Storage: memory kind does not match ",
             dev.str());
}

Storage::~Storage() {
  switch (kind) {
    case MemoryKind::Host: cpu_allocator::deallocate(data, bytes, device.index); break;
#if KILN_WITH_CUDA
    case MemoryKind::PinnedHost: pinned_allocator::deallocate(data); break;
    case MemoryKind::Device: cuda_allocator::deallocate(data); break;
#else
    default: break;
#endif
  }
}

// ---- Element conversion (host side) ----------------------------------------------------------

namespace {

// Copies n elements between host buffers of possibly different dtypes.
void convert_copy(const void* src, DType st, void* dst, DType dt, int64_t n) {
  cpu::convert(src, st, dst, dt, n);
}

// The gradient of t.to(device) is grad.to(source device).
struct ToDeviceBackward : Node {
  Device source;
  explicit ToDeviceBackward(Device s) : source(s) {}
  std::vector<Tensor> apply(const Tensor& g) override { return {g.to(source)}; }
  const char* name() const override { return "ToDeviceBackward"; }
};

struct ReshapeBackward : Node {
  Shape input_shape;
  explicit ReshapeBackward(Shape s) : input_shape(std::move(s)) {}
  std::vector<Tensor> apply(const Tensor& g) override { return {g.reshape(input_shape)}; }
  const char* name() const override { return "ReshapeBackward"; }
};

}  // namespace

// ---- Factories --------------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape)
    KILN_CHECK(d >= 0, "Tensor::empty: negative dimension in shape ", shape_str(shape));
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return from_storage(std::make_shared<Storage>(nbytes, device), shape, dtype);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  KILN_CHECK(format == MemoryFormat::Contiguous || shape.size() == 4, "Tensor::empty: the ",
             memory_format_name(format), " format needs a 4-D shape (N, C, H, W), got ",
             shape_str(shape));
  Tensor t = empty(shape, dtype, device);
  t.impl_->memory_format = format;
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, Shape shape, DType dtype,
                            int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = offset;
  impl->numel = shape_numel(shape);
  impl->shape = std::move(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device,
                           cuda::SyncSite site) {
  KILN_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ",
             values.size(), " values do not fill shape ", shape_str(shape));
  Tensor host = empty(shape, dtype_of<T>::value, Device());
  // An empty vector's data() may be null, and memcpy from null is undefined even for 0 bytes.
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
  if (device.is_cpu() && device.index == 0) return host;
  return host.to(device, /*non_blocking=*/false, site.named("Tensor::from_vector()"));
}

// ---- Metadata ---------------------------------------------------------------------------------

const Shape& Tensor::shape() const {
  KILN_CHECK(defined(), "shape() of an undefined tensor");
  return impl_->shape;
}

int64_t Tensor::size(int64_t d) const {
  int64_t r = dim();
  int64_t w = d < 0 ? d + r : d;
  KILN_CHECK(w >= 0 && w < r, "size(", d, ") of a tensor with shape ", shape_str(shape()));
  return impl_->shape[static_cast<size_t>(w)];
}

int64_t Tensor::numel() const { return defined() ? impl_->numel : 0; }
DType Tensor::dtype() const {
  KILN_CHECK(defined(), "dtype() of an undefined tensor");
  return impl_->dtype;
}
Device Tensor::device() const {
  KILN_CHECK(defined(), "device() of an undefined tensor");
  return impl_->storage->device;
}

MemoryFormat Tensor::memory_format() const {
  KILN_CHECK(defined(), "memory_format() of an undefined tensor");
  return impl_->memory_format;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return std::string("Tensor ") + dtype_name(dtype()) + " " + shape_str(shape()) + " on " +
         device().str() + (is_channels_last() ? " channels_last" : "");
}

void* Tensor::raw_data_any_format() const {
  KILN_CHECK(defined(), "data of an undefined tensor");
  return static_cast<char*>(impl_->storage->data) +
         impl_->offset * static_cast<int64_t>(dtype_size(impl_->dtype));
}

void* Tensor::raw_data() const {
  if (defined() && impl_->memory_format != MemoryFormat::Contiguous) {
    throw Error(str() + ": this op reads its input in NCHW order and has no kernel for the " +
                    memory_format_name(impl_->memory_format) +
                    " format; give it x.contiguous() (engine/tensor.h, MemoryFormat)",
                ErrorKind::Usage);
  }
  return raw_data_any_format();
}

template <typename T>
T* Tensor::data() const {
  KILN_CHECK(defined(), "data<", dtype_name(dtype_of<T>::value), ">() of an undefined tensor");
  KILN_CHECK(impl_->dtype == dtype_of<T>::value, "data<", dtype_name(dtype_of<T>::value),
             ">() of a tensor of dtype ", dtype_name(impl_->dtype));
  return static_cast<T*>(raw_data());
}

template <typename T>
T* Tensor::data_any_format() const {
  KILN_CHECK(defined(), "data<", dtype_name(dtype_of<T>::value), ">() of an undefined tensor");
  KILN_CHECK(impl_->dtype == dtype_of<T>::value, "data<", dtype_name(dtype_of<T>::value),
             ">() of a tensor of dtype ", dtype_name(impl_->dtype));
  return static_cast<T*>(raw_data_any_format());
}

template <typename T>
std::vector<T> Tensor::to_vector(cuda::SyncSite site) const {
  // In the shape's order, whatever the memory format.
  if (defined() && is_channels_last()) return detach().contiguous().to_vector<T>(site);
  Tensor host = device().is_cpu()
                    ? *this
                    : to(Device(), /*non_blocking=*/false, site.named("Tensor::to_vector()"));
  std::vector<T> out(static_cast<size_t>(numel()));
  convert_copy(host.raw_data(), host.dtype(), out.data(), dtype_of<T>::value, numel());
  return out;
}

double Tensor::item(cuda::SyncSite site) const {
  KILN_CHECK(numel() == 1, "item() needs a tensor of one element, got shape ", shape_str(shape()));
  return to_vector<double>(site.named("Tensor::item()"))[0];
}

// ---- Copies and views -------------------------------------------------------------------------

Tensor Tensor::to(Device target, bool non_blocking, cuda::SyncSite site) const {
  if (device() == target) return *this;
  Tensor out = empty(shape(), dtype(), target, memory_format());
  out.copy_(*this, non_blocking, site.named("Tensor::to()"));
  if (any_requires_grad({this})) {
    set_history(out, std::make_shared<ToDeviceBackward>(device()), {*this});
  }
  return out;
}

Tensor Tensor::to(DType target) const {
  if (dtype() == target) return *this;
  Tensor out = empty(shape(), target, device(), memory_format());
  out.copy_(*this);
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device(), memory_format());
  out.copy_(*this);
  return out;
}

Tensor Tensor::detach() const {
  Tensor out = from_storage(impl_->storage, impl_->shape, impl_->dtype, impl_->offset);
  out.impl_->memory_format = impl_->memory_format;
  return out;
}

Tensor Tensor::storage_order_view() const {
  if (!is_channels_last()) return detach();
  const Shape& s = shape();
  return from_storage(impl_->storage, {s[0], s[2], s[3], s[1]}, impl_->dtype, impl_->offset);
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  if (defined() && is_channels_last()) {
    // With one channel, or one pixel, the two orders are the same bytes: relabel, no copy.
    const bool same_bytes = size(1) == 1 || size(2) * size(3) == 1;
    const Tensor nchw = same_bytes ? relabel_memory_format(*this, MemoryFormat::Contiguous)
                                   : contiguous();
    return nchw.reshape(new_shape);
  }
  Shape s = new_shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      KILN_CHECK(infer < 0, "reshape to ", shape_str(new_shape), ": only one -1 is allowed");
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known > 0 && numel() % known == 0, "cannot reshape ", shape_str(shape()), " to ",
               shape_str(new_shape));
    s[static_cast<size_t>(infer)] = numel() / known;
  }
  KILN_CHECK(shape_numel(s) == numel(), "cannot reshape ", shape_str(shape()), " (", numel(),
             " elements) to ", shape_str(new_shape));
  Tensor out = detach();
  out.impl_->shape = s;
  if (any_requires_grad({this})) {
    set_history(out, std::make_shared<ReshapeBackward>(shape()), {*this});
  }
  return out;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  KILN_CHECK(dim() >= 1, "rows(", begin, ", ", end, ") of a 0-d tensor");
  KILN_CHECK(0 <= begin && begin <= end && end <= size(0), "rows(", begin, ", ", end,
             ") of shape ", shape_str(shape()), ": need 0 <= begin <= end <= ", size(0));
  KILN_CHECK(!requires_grad(), "rows() is not differentiable: call it on a tensor that does "
             "not require grad (an input batch), or detach() it first");
  Tensor out = detach();
  int64_t row = size(0) == 0 ? 0 : numel() / size(0);
  out.impl_->offset += begin * row;
  out.impl_->shape[0] = end - begin;
  out.impl_->numel = (end - begin) * row;
  return out;
}

Tensor Tensor::flatten(int64_t start_dim) const {
  int64_t r = dim();
  int64_t s = start_dim < 0 ? start_dim + r : start_dim;
  KILN_CHECK(s >= 0 && s <= r, "flatten(", start_dim, ") of shape ", shape_str(shape()));
  Shape out(shape().begin(), shape().begin() + s);
  int64_t rest = 1;
  for (int64_t i = s; i < r; ++i) rest *= shape()[static_cast<size_t>(i)];
  out.push_back(rest);
  return reshape(out);
}

Tensor Tensor::pin_memory() const {
  if (device().is_cuda()) {
    throw Error("pin_memory() of " + str() + ": only CPU tensors can be pinned", ErrorKind::Usage);
  }
  if (is_pinned()) return *this;
  Tensor out = from_storage(std::make_shared<Storage>(nbytes(), device(), MemoryKind::PinnedHost),
                            shape(), dtype());
  out.impl_->memory_format = memory_format();
  out.copy_(*this);
  return out;
}

bool Tensor::is_pinned() const {
  return defined() && impl_->storage->kind == MemoryKind::PinnedHost;
}

void Tensor::copy_(const Tensor& src, bool non_blocking, cuda::SyncSite site) {
  KILN_CHECK(numel() == src.numel(), "copy_: source ", src.str(), " does not match ", str());
  if (is_channels_last() || src.is_channels_last()) {
    // Element for element in the shape's order: reorder the source into this tensor's format
    // (a counted conversion), then copy the bytes as they lie.
    KILN_CHECK(shape() == src.shape(), "copy_: a ", memory_format_name(memory_format()),
               " tensor ", str(), " takes a source of its own shape, got ", src.str());
    const Tensor same_order = src.detach().to(memory_format());
    Tensor dst = storage_order_view();
    dst.copy_(same_order.storage_order_view(), non_blocking, site);
    return;
  }
  if (device().is_cpu() && src.device().is_cpu()) {
    // Both on (possibly different) CPUs: host memory either way.
    convert_copy(src.raw_data(), src.dtype(), raw_data(), dtype(), numel());
    return;
  }
  if constexpr (kWithCuda)
    cuda::copy_tensor(*this, src, non_blocking, site.named("Tensor::copy_()"));
  else
    cuda::check_device((device().is_cuda() ? device() : src.device()).index);  // throws
}

void Tensor::fill_(double value) {
  int64_t n = numel();
  if (device().is_cuda()) {
    if constexpr (kWithCuda) {
      cuda::DeviceGuard guard(device().index);
      cuda::fill(raw_data_any_format(), dtype(), n, value);
    } else {
      cuda::check_device(device().index);  // throws
    }
    return;
  }
  dispatch_any(dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(raw_data_any_format());
    const T v = convert_elem<T>(value);  // the rule of to(DType): f16 and bf16 round to nearest
#pragma omp parallel for if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  });
}

void Tensor::set_data(const Tensor& other) {
  KILN_CHECK(defined() && other.defined(), "set_data on an undefined tensor");
  impl_->storage = other.impl_->storage;
  impl_->offset = other.impl_->offset;
  impl_->shape = other.impl_->shape;
  impl_->dtype = other.impl_->dtype;
  impl_->numel = other.impl_->numel;
  impl_->memory_format = other.impl_->memory_format;
  impl_->grad = Tensor();
  impl_->grad_buffer = Tensor();  // on the old device or of the old shape
}

// ---- Autograd ---------------------------------------------------------------------------------

bool Tensor::requires_grad() const { return defined() && impl_->requires_grad; }

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  KILN_CHECK(defined(), "set_requires_grad on an undefined tensor");
  KILN_CHECK(is_leaf(), "set_requires_grad on a non-leaf tensor (", str(),
             "): use detach() first");
  // f16 and bf16 too: a 16-bit activation's gradient is 16-bit (engine/autocast.h).
  KILN_CHECK(!requires_grad || is_activation_dtype(dtype()),
             "only floating tensors can require grad, got ", str());
  impl_->requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const { return !impl_->grad_fn; }
Tensor Tensor::grad() const { return impl_->grad; }
void Tensor::set_grad(const Tensor& grad) {
  KILN_CHECK(!grad.defined() || grad.shape() == shape(), "set_grad: gradient ", grad.str(),
             " does not match ", str());
  impl_->grad = grad;
}
void Tensor::set_grad_buffer(const Tensor& buffer) {
  KILN_CHECK(defined(), "set_grad_buffer on an undefined tensor");
  KILN_CHECK(!buffer.defined() || (buffer.shape() == shape() && buffer.dtype() == dtype() &&
                                   buffer.device() == device()),
             "set_grad_buffer: buffer ", buffer.str(), " does not match ", str());
  impl_->grad_buffer = buffer;
}
Tensor Tensor::grad_buffer() const { return impl_->grad_buffer; }
const std::shared_ptr<Node>& Tensor::grad_fn() const { return impl_->grad_fn; }

void Tensor::backward(const Tensor& grad) const {
  if (grad.defined()) {
    kiln::backward(*this, grad);
    return;
  }
  KILN_CHECK(numel() == 1, "backward() without a gradient needs a one-element tensor, got ",
             shape_str(shape()), ": pass backward(grad)");
  kiln::backward(*this, Tensor::ones(shape(), dtype(), device()));
}

void Tensor::register_grad_ready_hook(GradHook hook) {
  KILN_CHECK(is_leaf() && requires_grad(), "grad-ready hooks go on leaves that require grad, not ",
             str());
  impl_->grad_ready_hooks.push_back(std::move(hook));
}

// ---- Checks -----------------------------------------------------------------------------------

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", shape_str(a.shape()), " vs ",
             shape_str(b.shape()));
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.device() == b.device(), op, ": tensors on different devices: ", a.device().str(),
             " and ", b.device().str(), "; move one with .to(device)");
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ: ", dtype_name(a.dtype()), " vs ",
             dtype_name(b.dtype()));
}

// ---- Explicit instantiations ------------------------------------------------------------------
#define KILN_INSTANTIATE(T)                                                               \
  template T* Tensor::data<T>() const;                                                    \
  template T* Tensor::data_any_format<T>() const;                                         \
  template std::vector<T> Tensor::to_vector<T>(cuda::SyncSite) const;                     \
  template Tensor Tensor::from_vector<T>(const std::vector<T>&, const Shape&, Device,     \
                                         cuda::SyncSite);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
KILN_INSTANTIATE(int32_t)
KILN_INSTANTIATE(int64_t)
KILN_INSTANTIATE(uint8_t)
KILN_INSTANTIATE(Half)
KILN_INSTANTIATE(BFloat16)
#undef KILN_INSTANTIATE

}  // namespace kiln
