// ops_cuda_test.cpp: what the parity table (tests/parity) does not cover of the core ops on
// cuda:0: errors (add_relu's devices, shapes and dtypes; mixed devices), sums that give the same
// bits run after run, and the same bits on a second device.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {

using testing::bit_identical;
using testing::kCuda;
using testing::leaf_on;
using testing::random_tensor;

TEST(OpsCuda, AddReluErrors) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor g = Tensor::ones({2, 3}, DType::F32, kCuda);
  EXPECT_THROW(add_relu(g, Tensor::ones({2, 3})), Error);                    // devices
  EXPECT_THROW(add_relu(g, Tensor::ones({3}, DType::F32, kCuda)), Error);    // no broadcast
  EXPECT_THROW(add_relu(g, Tensor::ones({2, 3}, DType::F64, kCuda)), Error); // dtypes
}

TEST(OpsCuda, SumIsDeterministic) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const Shape& s : {Shape{1, 200000}, Shape{20000, 7}}) {
    const Tensor x = random_tensor(s, 5, -1.0, 1.0, DType::F32).to(kCuda);
    const Tensor first = sum(x, {0, 1}), second = sum(x, {0, 1});
    EXPECT_TRUE(bit_identical("sum twice " + shape_str(s), second, first));
  }
}

// ---- A second device -------------------------------------------------------------------------

TEST(OpsCuda, SecondDeviceGivesTheSameBits) {
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  // The same deterministic kernels on cuda:1 (each op sets the device of its inputs).
  const Device kCuda1(DeviceType::CUDA, 1);
  const Tensor a = random_tensor({33, 130}, 81, -1.0, 1.0, DType::F32);
  const Tensor b = random_tensor({130, 7}, 82, -1.0, 1.0, DType::F32);
  auto run = [&](Device d) {
    const Tensor x = leaf_on(a, d), y = leaf_on(b, d);
    const Tensor out = sum(log_softmax(matmul(x, y), 1), {0});
    sum(mul(out, out)).backward();
    EXPECT_EQ(out.device(), d);
    EXPECT_EQ(x.grad().device(), d);
    return std::vector<Tensor>{out, x.grad(), y.grad(), argmax(transpose(x, 0, 1), 1)};
  };
  const std::vector<Tensor> on0 = run(kCuda), on1 = run(kCuda1);
  for (size_t i = 0; i < on0.size(); ++i)
    EXPECT_TRUE(bit_identical("result " + std::to_string(i) + " on cuda:1", on1[i], on0[i]));
}

// ---- Errors ---------------------------------------------------------------------------------

TEST(OpsCuda, MixedDevicesAreAnError) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor c = Tensor::ones({2, 3});
  const Tensor g = Tensor::ones({2, 3}, DType::F32, kCuda);
  const Tensor one = Tensor::ones({1});
  EXPECT_THROW(add(c, g), Error);
  EXPECT_THROW(mul(g, one), Error);  // even a one-element scalar must be on the same device
  EXPECT_THROW(matmul(g, c, false, true), Error);
  try {
    sub(g, c);
    FAIL() << "sub of a cuda and a cpu tensor did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace kiln
