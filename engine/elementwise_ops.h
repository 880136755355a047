// elementwise_ops.h: which elementwise operation a kernel applies, and how its second operand is
// broadcast. Shared by the CPU kernels (engine/ops_cpu.h), their CUDA twins (engine/ops_cuda.h)
// and the ops that call them (engine/ops_elementwise.cpp).
#pragma once

namespace kiln {

// AddRelu is max(a + b, 0): ResNet's residual join, fused so the sum is written once.
enum class BinaryOp { Add, Sub, Mul, Div, AddRelu };
// AddScalar and MulScalar take the kernel's `scalar` operand.
enum class UnaryOp { Neg, Exp, Log, Square, Relu, AddScalar, MulScalar };
// How the second operand of a binary op is broadcast over the first (see ops.h): the same
// shape, one element, or a row repeated along the last dimension.
enum class Broadcast { Same, Scalar, Row };

}  // namespace kiln
