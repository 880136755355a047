// conv2d_dnnl_primitives.h: the oneDNN convolution machinery shared by the f32 entry points
// (conv2d_dnnl.cpp, which defines it and explains layouts, staging and caching) and the
// bf16 / f16 ones (conv2d_dnnl_lowp.cpp). Internal to layers/.
//
// Data types: x, w and dy in the input dtype `in` (F32, BF16 or F16); dw and the bias always
// f32; y and dx f32, or `in` when g.y_lowp (conv2d_kernels.h).
#pragma once

#include "engine/dtype.h"
#include "layers/conv2d_kernels.h"

namespace kiln::dnnl_conv {

// What oneDNN chose for one primitive: a JIT kernel, its slow reference loops, or nothing
// (creating it reported "unimplemented").
enum class KernelKind { Fast, Reference, Missing };

struct ConvPrimitives;  // forward, backward-data and backward-weights primitives of one shape

// This thread's cached primitives for (g, bias, in, thread budget), created on first use (the
// forward one at once, the backward ones by the *_kind calls). For bf16 / f16 null when oneDNN
// has no forward convolution at all; any other failure throws kiln::Error naming the shape.
ConvPrimitives* conv_primitives(const ConvGeometry& g, bool bias, DType in);

// What oneDNN chose for each pass; the backward calls create that pass's primitive first.
KernelKind forward_kind(ConvPrimitives& cp);
KernelKind backward_data_kind(ConvPrimitives& cp, const ConvGeometry& g, DType in);
KernelKind backward_weights_kind(ConvPrimitives& cp, const ConvGeometry& g, DType in);

// y = conv(x, w) + b (b may be null: only when cp was made without bias).
void run_forward(ConvPrimitives& cp, const void* x, const void* w, const float* b, void* y);
// The gradients that are not null (db only when cp was made with bias); the passes they need
// must have been created (*_kind above) and not be Missing. x may be null when dw and db are,
// w when dx is.
void run_backward(ConvPrimitives& cp, const void* x, const void* dy, const void* w, void* dx,
                  float* dw, float* db);

}  // namespace kiln::dnnl_conv
