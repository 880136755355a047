// ops_elementwise.cpp: elementwise ops, their broadcasting rule, and their gradients.
//
// add, sub, mul, add_relu, relu, neg and the scalar add/mul take 16-bit activations (f16,
// bf16) as well as f32/f64: their kernels widen each element to f32, apply the same f32
// operation and round once on store (run_activation_kernel, compute_t), so a 16-bit result is
// the f32 op of the widened inputs, rounded. Both operands have one dtype. div, exp, log and
// square stay f32/f64 (low_precision_unsupported).
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/context.h"
#include "engine/dispatch.h"
#include "engine/elementwise_ops.h"
#include "engine/ops.h"
#include "engine/ops_cpu.h"
#include "engine/ops_cuda.h"

namespace kiln {

namespace {

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::AddRelu: return "add_relu";
  }
  return "?";
}

Broadcast broadcast_kind(const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape() == b.shape()) return Broadcast::Same;
  if (b.numel() == 1) return Broadcast::Scalar;
  if (b.dim() == 1 && a.dim() >= 1 && a.size(-1) == b.size(0)) return Broadcast::Row;
  throw Error(detail::str(op, ": cannot broadcast ", shape_str(b.shape()), " onto ",
                          shape_str(a.shape()),
                          ": the second operand must have the same shape, one element, or be "
                          "a row matching the last dimension"));
}

// Sums a gradient of a's shape down to b's shape (the adjoint of the broadcast).
Tensor reduce_to(const Tensor& g, const Shape& b_shape, Broadcast kind) {
  switch (kind) {
    case Broadcast::Same: return g;
    // A sum of a 16-bit g is f32 (reductions promote): rounded once to g's dtype.
    case Broadcast::Scalar: return sum(g).reshape(b_shape).to(g.dtype());
    case Broadcast::Row: return sum(g.reshape({-1, b_shape[0]}), {0}).to(g.dtype());
  }
  return g;
}

// Element-wise ops do not care about the order of the elements, only that the operands share
// it: the result takes a's memory format, and b is brought into it when it differs (a counted
// conversion). A row broadcast indexes the last logical dimension, so it runs in NCHW.
Tensor binary_forward(BinaryOp op, const Tensor& a_in, const Tensor& b_in, Broadcast kind) {
  const bool row = kind == Broadcast::Row;
  const Tensor a = row ? a_in.contiguous() : a_in;
  const Tensor b = kind == Broadcast::Same ? b_in.to(a.memory_format()) : b_in;
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device(), a.memory_format());
  run_activation_kernel(binary_name(op), a.device(), a.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    binary(backend, op, kind, a.template data_any_format<T>(), b.template data_any_format<T>(),
           out.template data_any_format<T>(), a.numel(), row ? b.numel() : 1);
  });
  return out;
}

struct BinaryBackward : Node {
  BinaryOp op;
  Broadcast kind;
  BinaryBackward(BinaryOp o, Broadcast k) : op(o), kind(k) {}
  const char* name() const override { return "BinaryBackward"; }
  // b's gradient (a bias's: a sum over rows) only when its edge is set.
  SplitMode split_mode() const override { return SplitMode::ByEdges; }
  std::vector<Tensor> apply(const Tensor& g) override {
    // saved = {a, b} (only for mul and div).
    Tensor ga, gb;
    bool need_a = next[0] != nullptr, need_b = next[1] != nullptr;
    switch (op) {
      case BinaryOp::Add:
        ga = g;
        if (need_b) gb = reduce_to(g, shape_b, kind);
        break;
      case BinaryOp::Sub:
        ga = g;
        if (need_b) gb = neg(reduce_to(g, shape_b, kind));
        break;
      case BinaryOp::Mul:
        if (need_a) ga = binary_forward(BinaryOp::Mul, g, saved[1], kind);
        if (need_b) gb = reduce_to(mul(g, saved[0]), shape_b, kind);
        break;
      case BinaryOp::Div: {
        Tensor ga_full = binary_forward(BinaryOp::Div, g, saved[1], kind);  // g / b
        if (need_a) ga = ga_full;
        // d(a/b)/db = -a / b^2 = -(g / b) * (a / b)
        if (need_b) gb = neg(reduce_to(mul(ga_full, binary_forward(BinaryOp::Div, saved[0], saved[1], kind)), shape_b, kind));
        break;
      }
      case BinaryOp::AddRelu:  // has its own node, AddReluBackward
        throw Error("add_relu: BinaryBackward cannot differentiate it (internal error)");
    }
    return {ga, gb};
  }
  Shape shape_b;  // b's shape, for reduce_to
};

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_same_device(a, b, name);
  check_same_dtype(a, b, name);
  if (op == BinaryOp::Div && is_low_precision(a.dtype()))
    throw Error(low_precision_unsupported(name, a.dtype()));
  Broadcast kind = broadcast_kind(a, b, name);
  Tensor out = binary_forward(op, a, b, kind);
  if (any_requires_grad({&a, &b})) {
    auto node = std::make_shared<BinaryBackward>(op, kind);
    node->shape_b = b.shape();
    if (op == BinaryOp::Mul || op == BinaryOp::Div) node->saved = {a.detach(), b.detach()};
    set_history(out, node, {a, b});
  }
  return out;
}

// The ops whose 16-bit form is not offered (their f32 results are not what a 16-bit network
// needs between layers, and exp/log would need the f32 math library's bounds restated).
bool unary_takes_low_precision(UnaryOp op) {
  return op != UnaryOp::Exp && op != UnaryOp::Log && op != UnaryOp::Square;
}

Tensor unary_forward(UnaryOp op, const Tensor& x, double scalar, const char* name) {
  if (is_low_precision(x.dtype()) && !unary_takes_low_precision(op))
    throw Error(low_precision_unsupported(name, x.dtype()));
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device(), x.memory_format());
  run_activation_kernel(name, x.device(), x.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    unary(backend, op, x.template data_any_format<T>(), out.template data_any_format<T>(),
          x.numel(), compute_t<T>(scalar));
  });
  return out;
}

// grad_x = grad_y where y > 0, else 0 (the backward of relu and of add_relu).
// In y's memory format (g is brought into it).
Tensor relu_backward(const Tensor& g_in, const Tensor& y) {
  check_same_device(g_in, y, "relu_backward");
  check_same_dtype(g_in, y, "relu_backward");
  const Tensor g = g_in.to(y.memory_format());
  Tensor gx = Tensor::empty(g.shape(), g.dtype(), g.device(), g.memory_format());
  run_activation_kernel("relu_backward", g.device(), g.dtype(), [&](auto backend, auto tag) {
    using T = typename decltype(tag)::type;
    relu_backward(backend, g.template data_any_format<T>(), y.template data_any_format<T>(),
                  gx.template data_any_format<T>(), g.numel());
  });
  return gx;
}

// saved = {y}: one mask serves both inputs.
struct AddReluBackward : Node {
  const char* name() const override { return "AddReluBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor gx = relu_backward(g, saved[0]);
    return {gx, gx};
  }
};

struct UnaryBackward : Node {
  UnaryOp op;
  double scalar;
  UnaryBackward(UnaryOp o, double s) : op(o), scalar(s) {}
  const char* name() const override { return "UnaryBackward"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    // saved = {x, y}
    const Tensor& x = saved[0];
    const Tensor& y = saved[1];
    switch (op) {
      case UnaryOp::Neg: return {neg(g)};
      case UnaryOp::Exp: return {mul(g, y)};
      case UnaryOp::Log: return {div(g, x)};
      case UnaryOp::Square: return {mul(mul(g, x), 2.0)};
      case UnaryOp::AddScalar: return {g};
      case UnaryOp::MulScalar: return {mul(g, scalar)};
      case UnaryOp::Relu: return {relu_backward(g, y)};
    }
    return {};
  }
};

Tensor unary(UnaryOp op, const Tensor& x, double scalar, const char* name) {
  Tensor out = unary_forward(op, x, scalar, name);
  if (any_requires_grad({&x})) {
    auto node = std::make_shared<UnaryBackward>(op, scalar);
    bool needs_x = op == UnaryOp::Log || op == UnaryOp::Square;
    bool needs_y = op == UnaryOp::Exp || op == UnaryOp::Relu;
    node->saved = {needs_x ? x.detach() : Tensor(), needs_y ? out.detach() : Tensor()};
    set_history(out, node, {x});
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Div, a, b); }
Tensor add(const Tensor& a, double b) { return unary(UnaryOp::AddScalar, a, b, "add"); }
Tensor mul(const Tensor& a, double b) { return unary(UnaryOp::MulScalar, a, b, "mul"); }
Tensor neg(const Tensor& a) { return unary(UnaryOp::Neg, a, 0, "neg"); }
Tensor exp(const Tensor& a) { return unary(UnaryOp::Exp, a, 0, "exp"); }
Tensor log(const Tensor& a) { return unary(UnaryOp::Log, a, 0, "log"); }
Tensor square(const Tensor& a) { return unary(UnaryOp::Square, a, 0, "square"); }
Tensor relu(const Tensor& a) { return unary(UnaryOp::Relu, a, 0, "relu"); }

Tensor add_relu(const Tensor& a, const Tensor& b) {
  check_same_device(a, b, "add_relu");
  check_same_dtype(a, b, "add_relu");
  KILN_CHECK(a.shape() == b.shape(), "add_relu: the operands must have the same shape, got ",
             shape_str(a.shape()), " and ", shape_str(b.shape()));
  Tensor out = binary_forward(BinaryOp::AddRelu, a, b, Broadcast::Same);
  if (any_requires_grad({&a, &b})) {
    auto node = std::make_shared<AddReluBackward>();
    node->saved = {out.detach()};
    set_history(out, node, {a, b});
  }
  return out;
}

}  // namespace kiln
