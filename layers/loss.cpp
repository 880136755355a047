// loss.cpp: the loss ops and their autograd nodes. Kernels: loss_cpu.cpp (CPU cross-entropy),
// loss_cuda.cu (CUDA cross-entropy and the fused CUDA mean squared error).
#include "layers/loss.h"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/sync_debug.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "layers/loss_kernels.h"
#if KILN_WITH_CUDA
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#endif

namespace kiln {

namespace {

[[noreturn]] void throw_bad_target(const Tensor& targets, int64_t row, int64_t classes,
                                   const char* which) {
  int64_t value = 0;
  {
    cuda::AllowSync allow("cross_entropy: a bad target is read for its error message");
    value = targets.to_vector<int64_t>()[static_cast<size_t>(row)];
  }
  throw Error(detail::str("cross_entropy", which, ": target ", value, " at row ", row,
                          " is outside [0, ", classes, "): check the labels"),
              ErrorKind::Input);
}

// ---- Bad targets on a GPU ---------------------------------------------------------------
// The kernels find the first bad row on the device. Reading it back at once would make every
// call wait for the device (before this, the op did: a wait per training step). Instead an
// asynchronous copy brings it into pinned host memory, and it is read once that copy has
// finished: polled by later calls on this thread (never waiting), or waited for by
// check_cross_entropy_targets(). Checks are read in the order of their calls.
#if KILN_WITH_CUDA
struct TargetCheck {
  Tensor bad_row;      // pinned host i64 [1]: the first bad row, or -1, once `copied`
  cuda::Event copied;  // recorded after the copy into bad_row
  Tensor targets;      // the call's targets, for the message
  int64_t classes = 0;
};
thread_local std::deque<TargetCheck> t_target_checks;

void defer_target_check(const Tensor& bad_row, const Tensor& targets, int64_t classes) {
  TargetCheck check;
  check.bad_row = Tensor::from_storage(
      std::make_shared<Storage>(sizeof(int64_t), Device(), MemoryKind::PinnedHost), {1},
      DType::I64);
  check.bad_row.copy_(bad_row, /*non_blocking=*/true);  // pinned: queued, the host goes on
  check.copied.record();  // on the stream of the copy (the current device's, held by the op)
  check.targets = targets.detach();
  check.classes = classes;
  t_target_checks.push_back(std::move(check));
}

// Throws for the first finished check that found a bad target (and drops the others). Without
// `wait` it reads only the checks whose copies have finished.
void resolve_target_checks(bool wait, cuda::SyncSite site) {
  std::deque<TargetCheck>& checks = t_target_checks;
  while (!checks.empty()) {
    TargetCheck& c = checks.front();
    if (wait) {
      c.copied.synchronize(site);
    } else if (!c.copied.query()) {
      return;
    }
    const int64_t bad = c.bad_row.data<int64_t>()[0];
    if (bad >= 0) {
      const TargetCheck failed = std::move(c);
      checks.clear();
      throw_bad_target(failed.targets, bad, failed.classes, " (an earlier call on this thread)");
    }
    checks.pop_front();
  }
}

// Whether the work queued on `device` now is being captured into a CUDA graph
// (engine/cuda/graph.h). A replay runs no host code, so the check above cannot follow it: a
// captured call neither polls nor defers a check (nor records the event and pinned copy a
// capture refuses). Its loss is still NaN for a bad target; a caller that captures its step
// checks the labels before they reach the device (MnistDataset validates them as it loads).
bool captured_on(Device device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(cuda::current_stream(device.index), &status));
  return status != cudaStreamCaptureStatusNone;
}
#else
void resolve_target_checks(bool, cuda::SyncSite) {}
#endif

// The incoming gradient of a scalar loss as the kernels read it: a scalar of the loss's dtype on
// the loss's device (converted only when the caller seeded backward otherwise).
Tensor scalar_grad_like(const Tensor& g, const Tensor& like) {
  Tensor s = g;
  if (s.dtype() != like.dtype()) s = s.to(like.dtype());
  if (s.device() != like.device()) s = s.to(like.device());
  return s;
}

struct CrossEntropyBackward : Node {
  const char* name() const override { return "CrossEntropyBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    // saved = {probs (N, C), targets (N)}
    const Tensor& probs = saved[0];
    const Tensor& targets = saved[1];
    Tensor grad = Tensor::empty(probs.shape(), probs.dtype(), probs.device());
    const Tensor gl = scalar_grad_like(g, probs);
    run_kernel("cross_entropy_backward", probs.device(), probs.dtype(),
               [&](auto backend, auto tag) {
                 using T = typename decltype(tag)::type;
                 cross_entropy_backward(backend, probs.data<T>(), targets.data<int64_t>(),
                                        grad.data<T>(), probs.size(0), probs.size(1),
                                        gl.data<T>());
               });
    return {grad, Tensor()};
  }
};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  KILN_CHECK(logits.dim() == 2, "cross_entropy: logits must be (N, C), got ",
             shape_str(logits.shape()));
  KILN_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0) &&
                 targets.dtype() == DType::I64,
             "cross_entropy: targets must be i64 (N) = (", logits.size(0), "), got ",
             targets.str());
  check_same_device(logits, targets, "cross_entropy");
  int64_t n = logits.size(0), c = logits.size(1);
  const bool on_cpu = logits.device().type == DeviceType::CPU;
#if KILN_WITH_CUDA
  const bool check_on_host = !on_cpu && !captured_on(logits.device());
#else
  const bool check_on_host = false;
#endif
  if (check_on_host) {  // earlier calls' bad targets, as far as known: never waits
    resolve_target_checks(/*wait=*/false, cuda::SyncSite());
  }
  Tensor probs = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  Tensor out = Tensor::empty({}, logits.dtype(), logits.device());  // the loss, a scalar
  Tensor bad_row = Tensor::empty({1}, DType::I64, logits.device());
  Tensor row_loss;  // the CUDA kernels' workspace
  if (!on_cpu) row_loss = Tensor::empty({n}, DType::F64, logits.device());
  run_kernel("cross_entropy", logits.device(), logits.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    cross_entropy_forward(backend, logits.data<T>(), targets.data<int64_t>(), probs.data<T>(),
                          out.data<T>(), bad_row.data<int64_t>(),
                          row_loss.defined() ? row_loss.data<double>() : nullptr, n, c);
  });
  if (on_cpu) {
    const int64_t bad = bad_row.data<int64_t>()[0];
    if (bad >= 0) throw_bad_target(targets, bad, c, "");
  } else {
    // On a GPU the loss stays on the device (NaN for a bad target); the first bad row (or -1)
    // comes back to the host asynchronously, and is read by a later call (see above).
#if KILN_WITH_CUDA
    if (check_on_host) defer_target_check(bad_row, targets, c);
#endif
  }
  if (any_requires_grad({&logits})) {
    auto node = std::make_shared<CrossEntropyBackward>();
    node->saved = {probs, targets.detach()};
    set_history(out, node, {logits, targets});
  }
  return out;
}

namespace {

// The fused CUDA mean squared error: one reduction in double instead of sub, square and mean
// (two (n) temporaries and three kernels), and one element-wise backward kernel.
struct MseLossBackward : Node {
  const char* name() const override { return "MseLossBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    const Tensor& a = saved[0];
    const Tensor& b = saved[1];
    KILN_CHECK(a.device().is_cuda(), "MseLossBackward: expected CUDA tensors, got ", a.str(),
               " (the CPU mse_loss composes sub, square and mean)");
    cuda::DeviceGuard guard(a.device().index);
    const Tensor gl = scalar_grad_like(g, a);
    Tensor ga, gb;  // only those an input needs (next[i] is null otherwise)
    if (next[0]) ga = Tensor::empty(a.shape(), a.dtype(), a.device());
    if (next[1]) gb = Tensor::empty(b.shape(), b.dtype(), b.device());
    dispatch_floating(a.dtype(), "mse_loss_backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      mse_loss_backward(cuda::Backend{}, a.data<T>(), b.data<T>(), gl.data<T>(), ptr(ga), ptr(gb),
                        a.numel());
    });
    return {ga, gb};
  }
};

Tensor mse_loss_cuda(const Tensor& a, const Tensor& b) {
  check_same_device(a, b, "mse_loss");
  check_same_dtype(a, b, "mse_loss");
  KILN_CHECK(is_floating(a.dtype()), "mse_loss: expected f32 or f64 tensors, got ", a.str());
  cuda::DeviceGuard guard(a.device().index);
  const int64_t n = a.numel();
  Tensor out = Tensor::empty({}, a.dtype(), a.device());
  Tensor partials =
      Tensor::empty({cuda::mse_loss_workspace_size(n)}, DType::F64, a.device());  // workspace
  dispatch_floating(a.dtype(), "mse_loss", [&](auto tag) {
    using T = typename decltype(tag)::type;
    mse_loss_forward(cuda::Backend{}, a.data<T>(), b.data<T>(), out.data<T>(),
                     partials.data<double>(), n);
  });
  if (any_requires_grad({&a, &b})) {
    auto node = std::make_shared<MseLossBackward>();
    node->saved = {a.detach(), b.detach()};
    set_history(out, node, {a, b});
  }
  return out;
}

}  // namespace

void check_cross_entropy_targets(cuda::SyncSite site) {
  resolve_target_checks(/*wait=*/true, site.named("check_cross_entropy_targets()"));
}

Tensor mse_loss(const Tensor& a, const Tensor& b) {
  check_same_shape(a, b, "mse_loss");
  // A build without a CUDA backend has no fused kernel: sub() says so for CUDA tensors.
  if constexpr (kWithCuda) {
    if (a.device().is_cuda() || b.device().is_cuda()) return mse_loss_cuda(a, b);
  }
  return mean(square(sub(a, b)));
}

}  // namespace kiln
