// gemm_lowp_cpu.cpp: the paths of cpu::gemm_lowp and the choice between them (contract:
// gemm_lowp_cpu.h). The hand AVX-512 BF16 kernel lives in gemm_bf16_avx512.cpp.
//
// oneDNN matmul. As in layers/conv2d_dnnl.cpp: describe the product (shapes, strides, data
// types), let oneDNN pick an implementation (the primitive descriptor), create the primitive
// once (a JIT compilation) and keep it in a thread_local cache keyed by the shape and this
// thread's OpenMP budget (some implementations fix their thread split at creation).
// Transposition needs no copy: op(A) (M,K) is described by its strides, {K, 1} as stored or
// {1, M} when trans_a. Debian's oneDNN 2.6 has bf16 matmul kernels on AMX and AVX-512 BF16
// ("brg:avx512_core_amx_bf16", "brg:avx512_core_bf16") but no f16 matmul on CPUs at all
// (creating one reports "unimplemented"), so there f16 takes the convert path. Whether a dtype
// has a non-reference kernel is asked once, on a probe shape (onednn_has_kernel).
#include "engine/gemm_lowp_cpu.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <utility>

#include "engine/convert_cpu.h"
#include "engine/dnnl_cpu.h"
#include "engine/error.h"
#include "engine/gemm_bf16_avx512.h"
#include "engine/ops_cpu.h"
#include "engine/tensor.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;

void check_input_dtype(DType in, const char* who) {
  KILN_CHECK(is_low_precision(in), who, ": inputs must be bf16 or f16, got ", dtype_name(in),
             "; f32 products go through cpu::gemm");
}

// ---- convert+f32 ---------------------------------------------------------------------------
void gemm_convert_f32(DType in, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      const uint16_t* a, const uint16_t* b, float* c) {
  Tensor a32 = Tensor::empty({m * k}), b32 = Tensor::empty({k * n});
  convert(a, in, a32.raw_data(), DType::F32, m * k);
  convert(b, in, b32.raw_data(), DType::F32, k * n);
  gemm<float>(Backend{}, trans_a, trans_b, m, n, k, a32.data<float>(), b32.data<float>(), c);
}

// ---- oneDNN matmul ---------------------------------------------------------------------------
struct Matmul {
  memory::desc a_md, b_md, c_md;
  dnnl::matmul primitive;
  bool reference = false;  // oneDNN fell back to its reference code for this shape

  Matmul(DType in, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k) {
    const memory::data_type t = dnnl_cpu::data_type(in);
    a_md = memory::desc({m, k}, t, trans_a ? memory::dims{1, m} : memory::dims{k, 1});
    b_md = memory::desc({k, n}, t, trans_b ? memory::dims{1, k} : memory::dims{n, 1});
    c_md = memory::desc({m, n}, memory::data_type::f32, memory::dims{n, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), dnnl_cpu::engine());
    reference = dnnl_cpu::is_reference(pd.impl_info_str());
    primitive = dnnl::matmul(pd);
  }
};

// The cache: (dtype, transpositions, shape, thread budget) -> primitive. A null entry: oneDNN
// has no implementation at all (it threw "unimplemented").
Matmul* matmul_for(DType in, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k) {
  using Key = std::array<int64_t, 7>;
  thread_local std::map<Key, std::unique_ptr<Matmul>> cache;
  const Key key{static_cast<int64_t>(in), trans_a, trans_b, m, n, k, omp_get_max_threads()};
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::unique_ptr<Matmul> entry;
    try {
      entry = std::make_unique<Matmul>(in, trans_a, trans_b, m, n, k);
    } catch (const dnnl::error& e) {
      if (e.status != dnnl_unimplemented)
        throw Error(detail::str("oneDNN could not create a ", dtype_name(in), " matmul of [", m,
                                ", ", k, "] x [", k, ", ", n, "]: ", e.what(),
                                "; use the hand kernels (KILN_KERNELS=hand)"));
    }
    it = cache.emplace(key, std::move(entry)).first;
  }
  return it->second.get();
}

// Whether oneDNN has a non-reference matmul for `in` here, asked once per dtype on a probe
// shape (a size its JIT kernels are made for).
bool onednn_has_kernel(DType in) {
  static const bool bf16 = [] {
    const Matmul* mm = matmul_for(DType::BF16, false, false, 64, 64, 64);
    return mm && !mm->reference;
  }();
  static const bool f16 = [] {
    const Matmul* mm = matmul_for(DType::F16, false, false, 64, 64, 64);
    return mm && !mm->reference;
  }();
  return in == DType::BF16 ? bf16 : f16;
}

void run_matmul(Matmul& mm, const uint16_t* a, const uint16_t* b, float* c) {
  dnnl::engine& eng = dnnl_cpu::engine();
  memory a_mem(mm.a_md, eng, const_cast<uint16_t*>(a));
  memory b_mem(mm.b_md, eng, const_cast<uint16_t*>(b));
  memory c_mem(mm.c_md, eng, c);
  mm.primitive.execute(dnnl_cpu::stream(),
                       {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
  dnnl_cpu::stream().wait();
}

// The path the twin of `impl` takes for `in`, before any per-shape fallback.
LowpGemmPath choose_path(DType in, Impl impl) {
  if (impl == Impl::Vendor)
    return onednn_has_kernel(in) ? LowpGemmPath::OneDnn : LowpGemmPath::ConvertF32;
  if (in == DType::BF16 && cpu_has_avx512_bf16()) return LowpGemmPath::Avx512Bf16;
  return LowpGemmPath::ConvertF32;
}

// The empty cases every path shares: nothing to write, or C = 0 (an empty sum).
bool handle_empty(int64_t m, int64_t n, int64_t k, float* c) {
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm_lowp: negative size m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return true;
  if (k == 0) {
    std::fill(c, c + m * n, 0.0f);
    return true;
  }
  return false;
}

}  // namespace

const char* lowp_gemm_path_name(LowpGemmPath path) {
  switch (path) {
    case LowpGemmPath::OneDnn: return "onednn";
    case LowpGemmPath::Avx512Bf16: return "avx512-bf16";
    case LowpGemmPath::ConvertF32: return "convert+f32";
  }
  return "?";
}

bool lowp_gemm_path_available(LowpGemmPath path, DType in) {
  check_input_dtype(in, "lowp_gemm_path_available");
  switch (path) {
    case LowpGemmPath::OneDnn: return onednn_has_kernel(in);
    case LowpGemmPath::Avx512Bf16: return in == DType::BF16 && cpu_has_avx512_bf16();
    case LowpGemmPath::ConvertF32: return true;
  }
  return false;
}

void gemm_lowp_with(LowpGemmPath path, DType in, bool trans_a, bool trans_b, int64_t m, int64_t n,
                    int64_t k, const uint16_t* a, const uint16_t* b, float* c) {
  check_input_dtype(in, "gemm_lowp");
  KILN_CHECK(lowp_gemm_path_available(path, in), "gemm_lowp: the ", lowp_gemm_path_name(path),
             " path cannot run ", dtype_name(in), " on this CPU; use convert+f32");
  if (handle_empty(m, n, k, c)) return;
  switch (path) {
    case LowpGemmPath::OneDnn: {
      Matmul* mm = matmul_for(in, trans_a, trans_b, m, n, k);
      KILN_CHECK(mm != nullptr, "gemm_lowp: oneDNN has no ", dtype_name(in), " matmul for [", m,
                 ", ", k, "] x [", k, ", ", n, "]; use convert+f32");
      return run_matmul(*mm, a, b, c);
    }
    case LowpGemmPath::Avx512Bf16:
      return gemm_bf16_avx512(trans_a, trans_b, m, n, k, a, b, c);
    case LowpGemmPath::ConvertF32:
      return gemm_convert_f32(in, trans_a, trans_b, m, n, k, a, b, c);
  }
}

void gemm_lowp(Backend, DType in, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const uint16_t* a, const uint16_t* b, float* c) {
  check_input_dtype(in, "gemm_lowp");
  if (handle_empty(m, n, k, c)) return;
  gemm_lowp_with(choose_path(in, Impl::Hand), in, trans_a, trans_b, m, n, k, a, b, c);
}

void gemm_lowp_vendor(Backend, DType in, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, const uint16_t* a, const uint16_t* b, float* c) {
  check_input_dtype(in, "gemm_lowp");
  if (handle_empty(m, n, k, c)) return;
  const LowpGemmPath path = choose_path(in, Impl::Vendor);
  if (path == LowpGemmPath::OneDnn) {
    // A shape oneDNN only has reference code for is faster converted.
    Matmul* mm = matmul_for(in, trans_a, trans_b, m, n, k);
    if (mm && !mm->reference) return run_matmul(*mm, a, b, c);
    return gemm_convert_f32(in, trans_a, trans_b, m, n, k, a, b, c);
  }
  gemm_lowp_with(path, in, trans_a, trans_b, m, n, k, a, b, c);
}

const char* gemm_lowp_path(DType in, Impl impl) {
  check_input_dtype(in, "gemm_lowp_path");
  return lowp_gemm_path_name(choose_path(in, impl));
}

}  // namespace kiln::cpu
