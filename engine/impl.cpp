// impl.cpp: the hand/vendor setting (process default, per-thread guard) and the one place that
// turns it into the implementation an op runs, with the rules of what each vendor has.
#include "engine/impl.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "engine/error.h"
#include "engine/gemm_lowp_cpu.h"

namespace kiln {
namespace {
// The process default: kUnread until KILN_KERNELS has been read (or set_default_impl ran),
// then static_cast<int>(Impl).
constexpr int kUnread = -1;
std::atomic<int> g_default{kUnread};

// This thread's innermost KernelsGuard, or kNone. A new thread starts with kNone: the default.
constexpr int kNone = -1;
thread_local int t_impl = kNone;
}  // namespace

Impl parse_impl(const char* name) {
  std::string s = name ? name : "";
  if (s == "hand") return Impl::Hand;
  if (s == "vendor") return Impl::Vendor;
  throw Error("invalid kernel implementation '" + s + "': use hand or vendor", ErrorKind::Usage);
}

const char* impl_name(Impl impl) { return impl == Impl::Hand ? "hand" : "vendor"; }

Impl default_impl() {
  int v = g_default.load();
  if (v == kUnread) {
    const char* env = std::getenv("KILN_KERNELS");
    v = static_cast<int>(env && *env ? parse_impl(env) : Impl::Vendor);
    int expected = kUnread;
    if (!g_default.compare_exchange_strong(expected, v)) v = expected;  // a setter won the race
  }
  return static_cast<Impl>(v);
}

void set_default_impl(Impl impl) { g_default.store(static_cast<int>(impl)); }

Impl current_impl() { return t_impl == kNone ? default_impl() : static_cast<Impl>(t_impl); }

KernelsGuard::KernelsGuard(Impl impl) : prev_(t_impl) { t_impl = static_cast<int>(impl); }

KernelsGuard::~KernelsGuard() { t_impl = prev_; }

Impl conv_impl(Device device, DType dtype) {
  const Impl wish = current_impl();
  // oneDNN's convolution is f32 only (and, under autocast, bf16/f16 where it has a kernel for
  // the CPU: layers/conv2d_lowp.cpp falls back to oneDNN's f32 convolution of the widened values
  // where it has none). f64, which the gradient checks use, always takes the hand kernels.
  if (device.is_cpu() && dtype == DType::F64) return Impl::Hand;
  // cuDNN has f32, f64, bf16 and f16 convolutions.
  return wish;
}

Impl gemm_impl(Device device, DType dtype) {
  const Impl wish = current_impl();
  if (device.is_cpu()) {
    // f32 and f64: the CPU has one GEMM, OpenBLAS's cpu::gemm, which is what both settings run
    // (our hand convolution is im2col + that GEMM).
    if (!is_low_precision(dtype)) return Impl::Hand;
    // bf16 / f16: oneDNN's matmul where oneDNN has a JIT kernel for the dtype on this CPU (its
    // reference code is slower than widening to f32); otherwise the hand twin, which runs our
    // AVX-512 BF16 kernel on CPUs with avx512_bf16 and widens to f32 for OpenBLAS elsewhere
    // (engine/gemm_lowp_cpu.h).
    if (wish == Impl::Vendor && cpu::lowp_gemm_path_available(cpu::LowpGemmPath::OneDnn, dtype))
      return Impl::Vendor;
    return Impl::Hand;
  }
  // CUDA: cuBLAS has f32, f64, bf16 and f16 products.
  return wish;
}

}  // namespace kiln
