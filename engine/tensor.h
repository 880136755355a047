// tensor.h: the Tensor handle.
//
// A Tensor is a cheap handle (a shared_ptr) to a TensorImpl: shared Storage, an element
// offset into it, a shape, a dtype, a device and a memory format. Tensors are always dense:
// row-major in the shape's order, or, for a 4-D tensor in the channels-last format, row-major
// in (N, H, W, C) order (MemoryFormat below). reshape() shares storage, transpose() copies.
// That keeps every kernel simple: it sees a dense buffer, a shape and at most two orders.
//
// Autograd fields live here too: requires_grad, the producing Node (grad_fn), the accumulated
// .grad of a leaf, and the leaf's grad-ready hooks (see autograd.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/sync_debug.h"  // SyncSite: where a copy that waits for a GPU was made
#include "engine/device.h"
#include "engine/dtype.h"

namespace kiln {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[128, 1, 28, 28]"
int64_t shape_numel(const Shape& s);

// Which allocator a Storage's bytes come from (and go back to).
enum class MemoryKind : uint8_t {
  Host,        // CPU memory (cpu_allocator)
  PinnedHost,  // page-locked CPU memory for fast, asynchronous GPU copies (pinned_allocator)
  Device,      // CUDA device memory (cuda_allocator, the caching allocator)
};

// Bytes on one device. Freed through the device's allocator when the last tensor lets go.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device;
  MemoryKind kind = MemoryKind::Host;
  // Host memory for a CPU device, device memory for cuda:N (throws kiln::Error (Usage) when
  // cuda:N does not exist, or in a build without CUDA).
  Storage(size_t bytes, Device device);
  Storage(size_t bytes, Device device, MemoryKind kind);  // PinnedHost needs a CPU device
  // Takes ownership of `data` (`bytes` long), already allocated by the allocator of `kind`,
  // which frees it. For blocks allocated differently from the constructors above, e.g. a CUDA
  // block owned by another stream than the caller's (the loader's copy stream).
  Storage(void* data, size_t bytes, Device device, MemoryKind kind);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

// How a tensor's elements lie in memory (the idea of PyTorch's torch.memory_format,
// https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html). The shape is always
// the logical one, (N, C, H, W) for an activation; only the order of the bytes differs:
//   Contiguous    row-major in the shape's order (NCHW for an activation)
//   ChannelsLast  a 4-D tensor, row-major in (N, H, W, C) order: the C channels of one pixel
//                 side by side, what cuDNN's tensor-core and oneDNN's 16-bit convolutions read
//                 directly (layers/layout.h)
// data() and raw_data() hand out Contiguous tensors only, so a kernel that indexes by the
// shape can never read a channels-last tensor as NCHW by mistake: it gets an error that says
// to convert. Kernels written for both orders (element-wise ops, the layers with channels-last
// kernels) read data_any_format() and look at memory_format().
enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast };
const char* memory_format_name(MemoryFormat f);  // "contiguous" | "channels_last"

class Tensor;
struct Node;
struct TensorImpl;
using GradHook = std::function<void(Tensor& grad)>;

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor (no storage); defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- Factories. Memory from empty() is uninitialised. -------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device());
  // Uninitialised, in `format` (ChannelsLast needs a 4-D shape).
  static Tensor empty(const Shape& shape, DType dtype, Device device, MemoryFormat format);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device());
  static Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = Device());
  // Copies host values into a new tensor of dtype_of<T> on `device` (on a GPU, a blocking copy:
  // the host waits for it, see the copy rules of to()).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device(), cuda::SyncSite site = cuda::SyncSite());
  // A tensor of `shape` and `dtype` over existing memory: element 0 is element `offset` of
  // `storage`, which the tensor shares (nothing is copied); its device is the storage's.
  static Tensor from_storage(std::shared_ptr<Storage> storage, Shape shape, DType dtype,
                             int64_t offset = 0);

  // ---- Metadata. ------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  MemoryFormat memory_format() const;
  bool is_channels_last() const { return memory_format() == MemoryFormat::ChannelsLast; }
  std::string str() const;  // "Tensor f32 [2, 3] on cpu:0", "... channels_last" when it is

  // ---- Data access (the tensor's own device memory; host memory only for CPU). ----------
  // Contiguous tensors only: a channels-last one throws kiln::Error (Usage) saying to convert.
  void* raw_data() const;
  template <typename T>
  T* data() const;  // checks that T matches dtype()
  // The same pointer in any memory format, for kernels that read memory_format().
  void* raw_data_any_format() const;
  template <typename T>
  T* data_any_format() const;
  // Copies to host as T (converting dtype). Works for any device; from a GPU the host waits for
  // the work that computes the tensor. The sync debug mode (engine/cuda/sync_debug.h) reports
  // these waits, and every blocking copy below, at the caller's line (`site`, a default
  // argument: never pass it).
  template <typename T>
  std::vector<T> to_vector(cuda::SyncSite site = cuda::SyncSite()) const;
  // The single element of a 1-element tensor, as double.
  double item(cuda::SyncSite site = cuda::SyncSite()) const;

  // ---- Copies and views. ------------------------------------------------------------------
  // Differentiable. non_blocking: the copy may return before it finished, only where one side
  // is pinned host memory (see engine/cuda/tensor_copy.h for the rules); to(cpu) from a CUDA
  // tensor allocates pageable memory, so it always returns with the data on the host.
  Tensor to(Device device, bool non_blocking = false,
            cuda::SyncSite site = cuda::SyncSite()) const;
  Tensor to(DType dtype) const;                                // not differentiable
  // This tensor in `format` (engine/memory_format.cpp): *this when it already is, else a
  // differentiable copy that reorders the elements (ChannelsLast needs a 4-D tensor). Every
  // reordering copy is counted (memory_format_conversions()).
  Tensor to(MemoryFormat format) const;
  Tensor contiguous() const { return to(MemoryFormat::Contiguous); }
  // The same bytes as a Contiguous tensor of the storage order's shape: (N, H, W, C) for a
  // channels-last tensor, the tensor itself otherwise. Shares storage; not differentiable.
  Tensor storage_order_view() const;
  Tensor clone() const;   // deep copy, no autograd history
  Tensor detach() const;  // shares storage, no autograd history
  // Shares storage; differentiable; one -1 allowed. A channels-last tensor is made contiguous
  // first (a copy), unless C or H * W is 1 (then both orders are the same bytes).
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const { return reshape(shape); }
  Tensor flatten(int64_t start_dim = 1) const;
  // Rows [begin, end) along dimension 0, sharing storage (a contiguous view): how a batch is cut
  // into micro-batches. Not differentiable: an error on a tensor that requires grad.
  Tensor rows(int64_t begin, int64_t end) const;
  // A copy of this CPU tensor in pinned (page-locked) host memory, which the GPU can copy from
  // asynchronously: t.pin_memory().to(cuda, /*non_blocking=*/true). Returns *this when already
  // pinned. Not differentiable. Needs a build with CUDA.
  Tensor pin_memory() const;
  bool is_pinned() const;
  // In-place (never recorded by autograd; used by optimizers and init).
  // Same number of elements; any devices (host <-> cuda:N, cuda:N <-> cuda:M); converts dtype.
  // non_blocking as in to(device, non_blocking).
  void copy_(const Tensor& src, bool non_blocking = false, cuda::SyncSite site = cuda::SyncSite());
  void fill_(double value);
  // Replaces this tensor's data (storage, shape, dtype, device) with `other`'s, keeping its
  // identity and autograd flags: how Module::to() moves parameters under optimizers' feet.
  void set_data(const Tensor& other);
  void zero_() { fill_(0.0); }

  // ---- Autograd. ----------------------------------------------------------------------------
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad);  // only for leaves
  bool is_leaf() const;
  Tensor grad() const;  // undefined until a backward pass reached this leaf
  void set_grad(const Tensor& grad);
  // Where backward puts this leaf's gradient: when a buffer is set (a tensor of the leaf's
  // shape, dtype and device, usually a view into a larger flat buffer) and .grad is undefined
  // or is that buffer, backward writes the gradient into the buffer (a copy, then in-place
  // additions) and .grad becomes the buffer, instead of allocating a new tensor. Setting .grad
  // to anything else, or an undefined buffer, restores the allocating behaviour.
  // comm::DataParallel sets it to a view into a gradient bucket (gradient as bucket view).
  void set_grad_buffer(const Tensor& buffer);
  Tensor grad_buffer() const;
  const std::shared_ptr<Node>& grad_fn() const;
  // Runs backward from this tensor; `grad` defaults to ones for a 1-element tensor.
  void backward(const Tensor& grad = Tensor()) const;
  // Called once per backward pass after this leaf's gradient is fully accumulated.
  void register_grad_ready_hook(GradHook hook);

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  DType dtype = DType::F32;
  int64_t numel = 0;
  MemoryFormat memory_format = MemoryFormat::Contiguous;

  // Autograd.
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;         // the node that produced this tensor (null: leaf)
  Tensor grad;                           // accumulated gradient of a leaf
  Tensor grad_buffer;                    // where backward writes .grad (see set_grad_buffer)
  std::weak_ptr<Node> grad_accumulator;  // a leaf's AccumulateGrad node, shared by its users
  std::vector<GradHook> grad_ready_hooks;
};

// Helpers used everywhere a shape or a device must match.
void check_same_shape(const Tensor& a, const Tensor& b, const char* op);
void check_same_device(const Tensor& a, const Tensor& b, const char* op);
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op);

}  // namespace kiln
