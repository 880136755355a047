// conv2d_dnnl.cpp: the vendor CPU path of Conv2d, cpu::conv2d_forward_vendor and
// cpu::conv2d_backward_vendor, through oneDNN (Debian's libdnnl, v2.6), the library PyTorch's
// CPU convolutions use. Float here; double always takes the hand kernels (conv_impl,
// engine/impl.h).
// The primitives, their cache and their execution are shared with the bf16/f16 entry points
// of conv2d_dnnl_lowp.cpp through conv2d_dnnl_primitives.h.
//
// oneDNN works in two steps: describe the operation (shapes, strides, padding, memory
// layouts) and let the library pick an implementation, a "primitive descriptor"; then create
// the primitive (this JIT-compiles its kernel, ~milliseconds) and execute it on memory
// objects. We create each primitive once per shape and keep it in a cache.
//
// Layouts. Our tensors are plain NCHW (weights OIHW), or channels-last: activations nhwc and
// weights ohwi (KRSC, after Module::to(MemoryFormat::ChannelsLast)). oneDNN's fastest kernels
// want blocked layouts (nChw16c: channels in blocks of 16, so one AVX-512 register holds 16
// channels of a pixel). We let oneDNN choose (format_tag::any); where it chose our layout we
// hand it our buffers directly, and where it did not we reorder into a staging buffer of its
// layout (and back for outputs). That is what PyTorch's mkldnn path does too. For the MNIST
// CNN oneDNN picks its AVX-512 direct kernels on nChw16c: the reorders cost ~10% of the time
// and the kernels run ~2x faster than our im2col + OpenBLAS on nchw. In backward, dy is
// reordered once for both gradients.
//
// Data types. x, w and dy are f32, or bf16 / f16 for the low-precision entry points; dw and
// the bias are f32 in every case, y and dx too unless g.y_lowp asks for them in the 16-bit
// input dtype (16-bit activations under autocast). One set of primitives describes all of
// these, with a data type per argument.
//
// Threads. This libdnnl uses OpenMP: it runs on the calling thread's OpenMP budget
// (omp_set_num_threads / kiln::set_num_threads). Some implementations fix their thread split
// when the primitive is created, so the thread budget is part of the cache key. The cache and
// the stream (engine/dnnl_cpu.h) are thread_local: pipeline stages on several threads each get
// their own primitives and never lock.
#include <omp.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <oneapi/dnnl/dnnl.hpp>

#include "engine/dnnl_cpu.h"
#include "engine/error.h"
#include "engine/tensor.h"
#include "layers/conv2d.h"
#include "layers/conv2d_dnnl_primitives.h"
#include "layers/conv2d_kernels.h"

namespace kiln {
namespace dnnl_conv {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dnnl_cpu::engine;
using dnnl_cpu::stream;

namespace {

// Direct convolution, or for 3x3 stride-1 kernels under set_conv_winograd(true) oneDNN's
// choice between direct and Winograd F(4x4, 3x3) (convolution_auto: Winograd where it has a
// kernel for the shape).
dnnl::algorithm conv_algorithm(const ConvGeometry& g) {
  const bool winograd = conv_winograd() && g.r == 3 && g.s == 3 && g.stride == 1;
  return winograd ? dnnl::algorithm::convolution_auto : dnnl::algorithm::convolution_direct;
}

// One tensor argument of a primitive: our buffer is used in place when the primitive accepts
// our layout; otherwise it is staged through a buffer in the primitive's layout. Staging
// buffers are Kiln tensors that live for one call: the CPU allocator keeps and reuses their
// blocks, and they count in the memory statistics. (Keeping them in the cache entry would pin
// ~100 MB per batch size: a test pass with a larger batch would never give its share back.)
struct Operand {
  memory::desc user_md;  // our layout (nchw / nhwc / oihw / ohwi / x)
  memory::desc prim_md;  // the layout the primitive wants
  dnnl::reorder to_prim, to_user;

  Operand() = default;
  Operand(const memory::desc& user, const memory::desc& prim) : user_md(user), prim_md(prim) {
    if (!direct()) {
      to_prim = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), user_md, engine(), prim_md));
      to_user = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), prim_md, engine(), user_md));
    }
  }
  bool direct() const { return user_md == prim_md; }
  // A buffer in the primitive's layout, held by `keep` for the duration of the call.
  memory staging(Tensor& keep) const {
    keep = Tensor::empty({static_cast<int64_t>((prim_md.get_size() + 3) / 4)}, DType::F32);
    return memory(prim_md, engine(), keep.raw_data());
  }
  // The memory the primitive reads: ours, or a reordered copy of it.
  memory input(const void* ptr, Tensor& keep) const {
    memory u(user_md, engine(), const_cast<void*>(ptr));
    if (direct()) return u;
    memory m = staging(keep);
    to_prim.execute(stream(), u, m);
    return m;
  }
  // The memory the primitive writes; call finish_output(m, ptr) after the primitive ran.
  memory output(void* ptr, Tensor& keep) const {
    return direct() ? memory(user_md, engine(), ptr) : staging(keep);
  }
  void finish_output(memory& m, void* ptr) const {
    if (direct()) return;
    memory u(user_md, engine(), ptr);
    to_user.execute(stream(), m, u);
  }
};

KernelKind kind_of(const std::string& impl_info) {
  return dnnl_cpu::is_reference(impl_info) ? KernelKind::Reference : KernelKind::Fast;
}

}  // namespace

// Everything for one convolution shape and input dtype: forward, backward-data and
// backward-weights primitives (the backward ones created on first use), with their operands.
struct ConvPrimitives {
  // Our layouts. x, w, dy in the input dtype; y, dx, dw, b f32.
  memory::desc x_md, w_md, b_md, y_md, dy_md, dx_md, dw_md;
  memory::dims strides, pad;
  bool bias = false;
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  KernelKind fwd_kind = KernelKind::Missing;
  Operand fx, fw, fy;
  bool have_bwd_data = false;
  KernelKind bwd_data_kind = KernelKind::Missing;
  dnnl::convolution_backward_data bwd_data;
  Operand dx_op, dw_op_data, dy_op_data;
  bool have_bwd_weights = false;
  KernelKind bwd_weights_kind = KernelKind::Missing;
  dnnl::convolution_backward_weights bwd_weights;
  Operand bx, bdw, bdy;

  bool x_blocked = false, y_blocked = false, x_nhwc = false, y_nhwc = false;
  dnnl::algorithm algo = dnnl::algorithm::convolution_direct;

  // How the primitives are told about an activation: a blocked or channels-last one as it is
  // (asking for `any` could pick yet another layout and bring the reorders back), a plain NCHW
  // one as `any`.
  static memory::desc any_layout(const memory::desc& md) {
    return memory::desc(md.dims(), md.data_type(), tag::any);
  }
  memory::desc x_arg(const memory::desc& md) const {
    return x_blocked || x_nhwc ? md : any_layout(md);
  }
  memory::desc y_arg(const memory::desc& md) const {
    return y_blocked || y_nhwc ? md : any_layout(md);
  }

  ConvPrimitives(const ConvGeometry& g, bool with_bias, DType in)
      : bias(with_bias), x_blocked(g.x_blocked), y_blocked(g.y_blocked), x_nhwc(g.x_nhwc),
        y_nhwc(g.y_nhwc), algo(conv_algorithm(g)) {
    const auto f32 = memory::data_type::f32;
    const auto lowp = dnnl_cpu::data_type(in);
    // Activations: plain NCHW, or already in oneDNN's blocked layout (layers/layout.h) or
    // channels-last (nhwc), which the kernels then read and write in place.
    const auto act_tag = [](bool blocked, bool nhwc) {
      return blocked ? tag::nChw16c : nhwc ? tag::nhwc : tag::nchw;
    };
    const tag x_tag = act_tag(g.x_blocked, g.x_nhwc);
    const tag y_tag = act_tag(g.y_blocked, g.y_nhwc);
    const memory::dims x_dims{g.n, g.c, g.h, g.w}, w_dims{g.k, g.c, g.r, g.s},
        y_dims{g.n, g.k, g.p, g.q};
    // y and dx: f32, or with g.y_lowp the input dtype (oneDNN rounds each f32 sum once).
    const auto out = g.y_lowp ? lowp : f32;
    x_md = memory::desc(x_dims, lowp, x_tag);
    dx_md = memory::desc(x_dims, out, x_tag);
    // The weight and dw as they lie: KCRS (oihw) or channels-last KRSC (ohwi, g.w_nhwc). Both
    // are user layouts oneDNN reorders into its own where the kernel wants another.
    const tag w_tag = g.w_nhwc ? tag::ohwi : tag::oihw;
    w_md = memory::desc(w_dims, lowp, w_tag);
    dw_md = memory::desc(w_dims, f32, w_tag);
    b_md = memory::desc({g.k}, f32, tag::x);
    y_md = memory::desc(y_dims, out, y_tag);
    dy_md = memory::desc(y_dims, lowp, y_tag);
    strides = {g.stride, g.stride};
    pad = {g.pad, g.pad};
    auto d = with_bias
                 ? dnnl::convolution_forward::desc(
                       dnnl::prop_kind::forward_training, algo,
                       x_arg(x_md), any_layout(w_md), b_md, y_arg(y_md), strides, pad, pad)
                 : dnnl::convolution_forward::desc(
                       dnnl::prop_kind::forward_training, algo,
                       x_arg(x_md), any_layout(w_md), y_arg(y_md), strides, pad, pad);
    fwd_pd = dnnl::convolution_forward::primitive_desc(d, engine());
    fwd_kind = kind_of(fwd_pd.impl_info_str());
    fwd = dnnl::convolution_forward(fwd_pd);
    fx = Operand(x_md, fwd_pd.src_desc());
    fw = Operand(w_md, fwd_pd.weights_desc());
    fy = Operand(y_md, fwd_pd.dst_desc());
  }

  void make_bwd_data() {
    have_bwd_data = true;
    dnnl::convolution_backward_data::desc d(algo, x_arg(dx_md), any_layout(w_md), y_arg(dy_md),
                                            strides, pad, pad);
    dnnl::convolution_backward_data::primitive_desc pd(d, engine(), fwd_pd);
    bwd_data_kind = kind_of(pd.impl_info_str());
    bwd_data = dnnl::convolution_backward_data(pd);
    dx_op = Operand(dx_md, pd.diff_src_desc());
    dw_op_data = Operand(w_md, pd.weights_desc());
    dy_op_data = Operand(dy_md, pd.diff_dst_desc());
  }

  void make_bwd_weights() {
    have_bwd_weights = true;
    auto d = bias ? dnnl::convolution_backward_weights::desc(
                        algo, x_arg(x_md), any_layout(dw_md), b_md, y_arg(dy_md), strides, pad, pad)
                  : dnnl::convolution_backward_weights::desc(
                        algo, x_arg(x_md), any_layout(dw_md), y_arg(dy_md), strides, pad, pad);
    dnnl::convolution_backward_weights::primitive_desc pd(d, engine(), fwd_pd);
    bwd_weights_kind = kind_of(pd.impl_info_str());
    bwd_weights = dnnl::convolution_backward_weights(pd);
    bx = Operand(x_md, pd.src_desc());
    bdw = Operand(dw_md, pd.diff_weights_desc());
    bdy = Operand(dy_md, pd.diff_dst_desc());
  }
};

namespace {

std::string describe(const ConvGeometry& g, DType in) {
  return detail::str(dtype_name(in), " convolution of input [", g.n, ", ", g.c, ", ", g.h, ", ",
                     g.w, "], weights [", g.k, ", ", g.c, ", ", g.r, ", ", g.s, "]");
}

// Runs make() (a backward primitive's creation): for bf16 / f16 an "unimplemented" from oneDNN
// leaves the kind Missing; any other failure, and any for f32, is an error.
template <typename Make>
void create_backward(Make&& make, const ConvGeometry& g, DType in) {
  try {
    make();
  } catch (const dnnl::error& e) {
    if (in == DType::F32 || e.status != dnnl_unimplemented)
      throw Error(detail::str("oneDNN could not create the backward ", describe(g, in), ": ",
                              e.what(), "; use the hand kernels (KILN_KERNELS=hand)"));
  }
}

}  // namespace

ConvPrimitives* conv_primitives(const ConvGeometry& g, bool bias, DType in) {
  using Key = std::array<int64_t, 15>;
  thread_local std::map<Key, std::unique_ptr<ConvPrimitives>> cache;
  const Key key{g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.stride, g.pad, bias, omp_get_max_threads(),
                g.w_nhwc * 16 + g.x_blocked * 8 + g.y_blocked * 4 + g.x_nhwc * 2 + g.y_nhwc,
                static_cast<int64_t>(conv_algorithm(g)),
                static_cast<int64_t>(in), g.y_lowp};
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::unique_ptr<ConvPrimitives> entry;
    try {
      entry = std::make_unique<ConvPrimitives>(g, bias, in);
    } catch (const dnnl::error& e) {
      // Low precision may simply have no implementation here: remembered as a null entry.
      if (in == DType::F32 || e.status != dnnl_unimplemented)
        throw Error(detail::str("oneDNN could not create a ", describe(g, in), ": ", e.what(),
                                "; use the hand kernels (KILN_KERNELS=hand)"));
    }
    it = cache.emplace(key, std::move(entry)).first;
  }
  return it->second.get();
}

KernelKind forward_kind(ConvPrimitives& cp) { return cp.fwd_kind; }

KernelKind backward_data_kind(ConvPrimitives& cp, const ConvGeometry& g, DType in) {
  if (!cp.have_bwd_data) create_backward([&] { cp.make_bwd_data(); }, g, in);
  return cp.bwd_data_kind;
}

KernelKind backward_weights_kind(ConvPrimitives& cp, const ConvGeometry& g, DType in) {
  if (!cp.have_bwd_weights) create_backward([&] { cp.make_bwd_weights(); }, g, in);
  return cp.bwd_weights_kind;
}

void run_forward(ConvPrimitives& cp, const void* x, const void* w, const float* b, void* y) {
  Tensor kx, kw, ky;  // staging buffers, if any
  memory y_mem = cp.fy.output(y, ky);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, cp.fx.input(x, kx)},
                                       {DNNL_ARG_WEIGHTS, cp.fw.input(w, kw)},
                                       {DNNL_ARG_DST, y_mem}};
  if (b) args[DNNL_ARG_BIAS] = memory(cp.b_md, engine(), const_cast<float*>(b));
  cp.fwd.execute(stream(), args);
  cp.fy.finish_output(y_mem, y);
  stream().wait();
}

void run_backward(ConvPrimitives& cp, const void* x, const void* dy, const void* w, void* dx,
                  float* dw, float* db) {
  Tensor kdy, kx, kdw, kw, kdx, kdy2;  // staging buffers, if any
  memory dy_w;  // dy in the layout of backward-weights; reused by backward-data if it fits
  if (dw || db) {
    KILN_CHECK(cp.have_bwd_weights && cp.bwd_weights_kind != KernelKind::Missing,
               "conv2d backward (oneDNN): no backward-weights primitive");
    dy_w = cp.bdy.input(dy, kdy);
    // oneDNN always computes dw; when the caller does not want it, it lands in a throwaway
    // buffer.
    memory dw_mem = dw ? cp.bdw.output(dw, kdw) : cp.bdw.staging(kdw);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, cp.bx.input(x, kx)},
                                         {DNNL_ARG_DIFF_DST, dy_w},
                                         {DNNL_ARG_DIFF_WEIGHTS, dw_mem}};
    if (db) args[DNNL_ARG_DIFF_BIAS] = memory(cp.b_md, engine(), db);
    cp.bwd_weights.execute(stream(), args);
    if (dw) cp.bdw.finish_output(dw_mem, dw);
  }
  if (dx) {
    KILN_CHECK(cp.have_bwd_data && cp.bwd_data_kind != KernelKind::Missing,
               "conv2d backward (oneDNN): no backward-data primitive");
    // dy is read-only: the copy made for backward-weights serves here too when the layouts
    // agree (they do for the blocked kernels), saving one reorder of the largest tensor.
    memory dy_d = (dy_w && cp.bdy.prim_md == cp.dy_op_data.prim_md)
                      ? dy_w
                      : cp.dy_op_data.input(dy, kdy2);
    memory dx_mem = cp.dx_op.output(dx, kdx);
    cp.bwd_data.execute(stream(), {{DNNL_ARG_DIFF_DST, dy_d},
                                   {DNNL_ARG_WEIGHTS, cp.dw_op_data.input(w, kw)},
                                   {DNNL_ARG_DIFF_SRC, dx_mem}});
    cp.dx_op.finish_output(dx_mem, dx);
  }
  stream().wait();
}

}  // namespace dnnl_conv

// ---- the f32 entry points (conv2d_kernels.h) ----------------------------------------------------

namespace cpu {

void conv2d_forward_vendor(Backend, const float* x, const float* w, const float* b, float* y,
                           const ConvGeometry& g) {
  dnnl_conv::ConvPrimitives* cp = dnnl_conv::conv_primitives(g, b != nullptr, DType::F32);
  dnnl_conv::run_forward(*cp, x, w, b, y);
}

void conv2d_backward_vendor(Backend, const float* x, const float* dy, const float* w, float* dx,
                            float* dw, float* db, const ConvGeometry& g) {
  dnnl_conv::ConvPrimitives* cp = dnnl_conv::conv_primitives(g, db != nullptr, DType::F32);
  // f32 always has kernels: these create the primitives (or throw naming the shape).
  if (dw || db) dnnl_conv::backward_weights_kind(*cp, g, DType::F32);
  if (dx) dnnl_conv::backward_data_kind(*cp, g, DType::F32);
  dnnl_conv::run_backward(*cp, x, dy, w, dx, dw, db);
}

}  // namespace cpu
}  // namespace kiln
