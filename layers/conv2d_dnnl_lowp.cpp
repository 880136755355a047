// conv2d_dnnl_lowp.cpp: oneDNN convolutions of mixed-precision training,
// cpu::conv2d_forward_lowp_vendor and cpu::conv2d_backward_lowp_vendor: x, w and dy in bf16 or
// f16, dw and db in f32, y and dx in f32 or, with g.y_lowp, bf16/f16 (contract:
// conv2d_kernels.h). oneDNN reads the 16-bit inputs,
// multiplies them exactly and sums in f32, like the GEMMs of engine/gemm_lowp_cpu.h.
//
// The primitives, their layouts, staging and cache are those of the f32 path
// (conv2d_dnnl.cpp, through conv2d_dnnl_primitives.h) with per-argument data types. What is
// new here is the refusal: for a dtype where oneDNN only has its reference loops (or nothing),
// these return false before computing anything, and the caller converts to f32 and runs the f32
// kernels, which is faster than oneDNN's reference code. On CPUs with AVX512_BF16 or AMX,
// oneDNN 2.6 has JIT kernels for bf16 in every pass; for f16 it has none.
#include <cstdint>

#include "engine/error.h"
#include "layers/conv2d_dnnl_primitives.h"
#include "layers/conv2d_kernels.h"

namespace kiln::cpu {
namespace {

void check_lowp_call(DType in, const ConvGeometry& g, const char* who) {
  KILN_CHECK(is_low_precision(in), who, ": x, w and dy must be bf16 or f16, got ",
             dtype_name(in), "; f32 convolutions go through the f32 kernels");
  KILN_CHECK(!g.x_blocked && !g.y_blocked, who,
             ": bf16/f16 convolutions take NCHW or channels-last tensors; convert blocked ones "
             "with from_channel_blocks");
}

}  // namespace

bool conv2d_forward_lowp_vendor(Backend, DType in, const uint16_t* x, const uint16_t* w,
                                const float* b, void* y, const ConvGeometry& g) {
  check_lowp_call(in, g, "conv2d_forward_lowp_vendor");
  dnnl_conv::ConvPrimitives* cp = dnnl_conv::conv_primitives(g, b != nullptr, in);
  if (cp == nullptr || dnnl_conv::forward_kind(*cp) != dnnl_conv::KernelKind::Fast) return false;
  dnnl_conv::run_forward(*cp, x, w, b, y);
  return true;
}

bool conv2d_backward_lowp_vendor(Backend, DType in, const uint16_t* x, const uint16_t* dy,
                                 const uint16_t* w, void* dx, float* dw, float* db,
                                 const ConvGeometry& g) {
  check_lowp_call(in, g, "conv2d_backward_lowp_vendor");
  const bool weights = dw != nullptr || db != nullptr;
  dnnl_conv::ConvPrimitives* cp = dnnl_conv::conv_primitives(g, db != nullptr, in);
  if (cp == nullptr) return false;
  // Both passes are checked before either runs: a refusal must leave every output untouched.
  using dnnl_conv::KernelKind;
  if (weights && dnnl_conv::backward_weights_kind(*cp, g, in) != KernelKind::Fast) return false;
  if (dx && dnnl_conv::backward_data_kind(*cp, g, in) != KernelKind::Fast) return false;
  dnnl_conv::run_backward(*cp, x, dy, w, dx, dw, db);
  return true;
}

}  // namespace kiln::cpu
