// Autograd engine: accumulation, ordering, freed saved tensors, grad mode, hooks.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/ops.h"

using namespace kiln;

static Tensor leaf(std::vector<double> v, Shape s) {
  Tensor t = Tensor::from_vector(v, s);
  t.set_requires_grad(true);
  return t;
}

TEST(Autograd, AccumulatesOverUsesAndCalls) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = sum(add(mul(x, x), x));  // dy/dx = 2x + 1
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 5, 7}));
  sum(x).backward();  // a second graph accumulates into .grad
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{4, 6, 8}));
}

TEST(Autograd, DiamondGraphWaitsForAllBranches) {
  Tensor x = leaf({2}, {1});
  Tensor a = mul(x, 3.0), b = square(x);
  Tensor y = mul(a, b);  // 3x * x^2 = 3x^3 -> 9x^2 = 36
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 36.0);
}

TEST(Autograd, SecondBackwardThroughFreedGraphIsAnError) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sum(mul(x, x));
  y.backward();
  EXPECT_THROW(y.backward(), Error);
}

TEST(Autograd, SavedTensorsAreReleased) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = mul(x, x);
  auto node = y.grad_fn();
  EXPECT_EQ(node->saved.size(), 2u);
  sum(y).backward();
  EXPECT_TRUE(node->saved.empty());
}

TEST(Autograd, NoGradGuardRecordsNothingAndIsThreadLocal) {
  Tensor x = leaf({1}, {1});
  {
    NoGradGuard g;
    EXPECT_FALSE(mul(x, 2.0).requires_grad());
    bool other_thread_records = false;
    std::thread t([&] { other_thread_records = mul(x, 2.0).requires_grad(); });
    t.join();
    EXPECT_TRUE(other_thread_records);
  }
  EXPECT_TRUE(mul(x, 2.0).requires_grad());
}

TEST(Autograd, BackwardWithExplicitGradient) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = mul(x, 2.0);
  y.backward(Tensor::from_vector<double>({1, 10, 100}, {3}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 20, 200}));
  EXPECT_THROW(mul(x, 2.0).backward(), Error);  // non-scalar without a gradient
}

TEST(Autograd, GradReadyHookFiresOnceAfterFullAccumulation) {
  Tensor x = leaf({1, 1}, {2});
  std::vector<double> seen;
  int calls = 0;
  x.register_grad_ready_hook([&](Tensor& g) {
    ++calls;
    seen = g.to_vector<double>();
  });
  Tensor y = sum(add(mul(x, 2.0), mul(x, 3.0)));
  y.backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{5, 5}));
}

TEST(Autograd, LaterNodesRunFirst) {
  // Two leaves feeding separate branches: the branch created last gets its gradient first.
  Tensor a = leaf({1}, {1}), b = leaf({1}, {1});
  std::vector<char> order;
  a.register_grad_ready_hook([&](Tensor&) { order.push_back('a'); });
  b.register_grad_ready_hook([&](Tensor&) { order.push_back('b'); });
  Tensor ya = mul(a, 2.0);
  Tensor yb = mul(b, 2.0);
  add(ya, yb).backward();
  EXPECT_EQ(order, (std::vector<char>{'b', 'a'}));
}

TEST(Autograd, BackwardOnTensorWithoutGradIsAnError) {
  Tensor x = Tensor::ones({1});
  EXPECT_THROW(x.backward(), Error);
}
