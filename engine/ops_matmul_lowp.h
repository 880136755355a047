// ops_matmul_lowp.h: matmul's autocast path (internal to the engine; engine/autocast.h explains
// the policy). matmul() calls it when autocast applies to its inputs.
#pragma once

#include "engine/tensor.h"

namespace kiln {

// a and b f32; the product of their autocast_dtype() roundings summed in f32, as an f32 tensor,
// with a node whose backward rounds the incoming gradient the same way.
Tensor matmul_autocast(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);

// C f32 = op(A) op(B) for A and B both bf16 or both f16, no autograd: the kernel choice.
Tensor matmul_lowp_product(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);

}  // namespace kiln
