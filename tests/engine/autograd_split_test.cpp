// The backward pass in two halves (backward_input_grads, WeightGradients; engine/autograd.h):
// which gradients each half produces, that together they equal backward() bit for bit, where
// the grad-ready hooks fire, and the errors. Every layer's split is checked against its whole
// backward in the parity table (tests/parity/parity_split_test.cpp).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

Tensor random_leaf(const Shape& shape, uint32_t seed) {
  Tensor t = testing::random_tensor(shape, seed, -1.0, 1.0, DType::F32);
  t.set_requires_grad(true);
  return t;
}

// Two linear layers with a ReLU between and a bias on the first; w2 enters through a
// transpose (a node on the weights' side) and w1 is used twice (two gradient terms).
struct TinyNet {
  Tensor x = random_leaf({5, 4}, 1);
  Tensor w1 = random_leaf({6, 4}, 2);
  Tensor b1 = random_leaf({6}, 3);
  Tensor w2 = random_leaf({3, 6}, 4);
  Tensor forward() const {
    Tensor h = relu(add(matmul(x, w1, false, true), b1));
    Tensor y = matmul(h, transpose(w2, 0, 1));
    return add(y, mul(sum(mul(w1, w1)), 0.01));  // a weight penalty: the weights' side only
  }
  std::vector<Tensor> leaves() const { return {x, w1, b1, w2}; }
};

Tensor grad_seed(const Tensor& y) { return testing::random_tensor(y.shape(), 9, -1, 1, DType::F32); }

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>()) << what;
}

TEST(SplitBackward, TheHalvesTogetherEqualTheWholeBackwardBitForBit) {
  TinyNet whole, split;
  Tensor y = whole.forward();
  y.backward(grad_seed(y));
  Tensor ys = split.forward();
  WeightGradients w = backward_input_grads(ys, grad_seed(ys), {split.x});
  // The first half: the input's gradient only.
  expect_same_bits(split.x.grad(), whole.x.grad(), "x after the input half");
  EXPECT_FALSE(split.w1.grad().defined());
  EXPECT_FALSE(split.b1.grad().defined());
  EXPECT_FALSE(split.w2.grad().defined());
  EXPECT_TRUE(w.pending());
  EXPECT_GE(w.deferred_nodes(), 2);  // both matmuls and the bias add
  EXPECT_TRUE(w.ran_whole().empty());
  w.run();
  EXPECT_FALSE(w.pending());
  const char* names[] = {"x", "w1", "b1", "w2"};
  for (size_t i = 0; i < 4; ++i)
    expect_same_bits(split.leaves()[i].grad(), whole.leaves()[i].grad(), names[i]);
}

TEST(SplitBackward, WithNoInputsNamedEveryLeafWaitsForTheWeightHalf) {
  TinyNet whole, split;
  Tensor y = whole.forward();
  y.backward(grad_seed(y));
  Tensor ys = split.forward();
  WeightGradients w = backward_input_grads(ys, grad_seed(ys), {});
  for (const Tensor& t : split.leaves()) EXPECT_FALSE(t.grad().defined());
  w.run();
  for (size_t i = 0; i < 4; ++i)
    expect_same_bits(split.leaves()[i].grad(), whole.leaves()[i].grad(), std::to_string(i));
}

TEST(SplitBackward, GradReadyHooksFireInTheWeightHalf) {
  TinyNet net;
  int fired = 0;
  net.w2.register_grad_ready_hook([&](Tensor&) { ++fired; });
  Tensor y = net.forward();
  WeightGradients w = backward_input_grads(y, grad_seed(y), {net.x});
  EXPECT_EQ(fired, 0);
  w.run();
  EXPECT_EQ(fired, 1);
}

TEST(SplitBackward, TheWeightHalfOutlivesTheGraphsOutput) {
  TinyNet whole, split;
  Tensor y = whole.forward();
  y.backward(grad_seed(y));
  WeightGradients w;
  {
    Tensor ys = split.forward();
    w = backward_input_grads(ys, grad_seed(ys), {split.x});
  }  // the output and with it the caller's handle on the graph are gone
  w.run();
  expect_same_bits(split.w1.grad(), whole.w1.grad(), "w1");
}

TEST(SplitBackward, ANodeThatCannotSplitRunsWholeAndSaysSo) {
  Tensor x = random_leaf({8}, 1), b = random_leaf({8}, 2);
  Tensor xw = random_leaf({8}, 1), bw = random_leaf({8}, 2);
  sum(add_relu(xw, bw)).backward();
  WeightGradients w = backward_input_grads(sum(add_relu(x, b)), Tensor(), {x});
  ASSERT_EQ(w.ran_whole().size(), 1u);
  EXPECT_EQ(w.ran_whole()[0], "AddReluBackward");
  EXPECT_FALSE(b.grad().defined());  // computed, but accumulated only by the weight half
  w.run();
  expect_same_bits(x.grad(), xw.grad(), "x");
  expect_same_bits(b.grad(), bw.grad(), "b");
}

TEST(SplitBackward, ARootOfWeightsOnlyIsAllWeightHalf) {
  Tensor w1 = random_leaf({4}, 1), w1_ref = random_leaf({4}, 1);
  sum(mul(w1_ref, w1_ref)).backward();
  WeightGradients w = backward_input_grads(sum(mul(w1, w1)), Tensor(), {});
  EXPECT_TRUE(w.pending());
  EXPECT_FALSE(w1.grad().defined());
  w.run();
  expect_same_bits(w1.grad(), w1_ref.grad(), "w1");
}

TEST(SplitBackward, MisuseIsAnErrorThatSaysWhy) {
  TinyNet net;
  Tensor y = net.forward();
  WeightGradients w = backward_input_grads(y, grad_seed(y), {net.x});
  w.run();
  EXPECT_THROW(w.run(), Error);
  Tensor plain = Tensor::ones({2});
  EXPECT_THROW(backward_input_grads(plain, Tensor(), {}), Error);
  Tensor z = net.forward();
  EXPECT_THROW(backward_input_grads(z, Tensor(), {}), Error);  // not one element: give a gradient
  Tensor not_leaf = mul(net.x, 2.0);
  EXPECT_THROW(backward_input_grads(sum(not_leaf), Tensor(), {not_leaf}), Error);
}

}  // namespace
}  // namespace kiln
