// trace_cuda_test.cpp: spans on a CUDA device are timed by GPU events on the current stream and
// resolved onto the host clock in spans().
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "engine/cuda/context.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "engine/trace.h"
#include "support/cuda_skip.h"

namespace kiln::trace {
namespace {

TEST(TraceCuda, SpanAroundKernelsAndCopiesResolvesOntoTheHostClock) {
  KILN_SKIP_WITHOUT_CUDA();
  Tracer& tracer = Tracer::global();
  tracer.clear();
  tracer.enable();
  const Device gpu(DeviceType::CUDA, 0);
  const double before = tracer.now_us();
  {
    Scope s("forward", Phase::Forward, gpu, Ids{0, 1});
    Tensor a = Tensor::ones({256, 256}, DType::F32, gpu);
    Tensor b = matmul(a, a);  // a kernel
    Tensor host = b.to(Device());  // and a copy back
    EXPECT_FLOAT_EQ(host.to_vector<float>()[0], 256.0f);
  }
  { Scope h("optimizer", Phase::Optimizer); }  // a host span after it
  const std::vector<Span> spans = tracer.spans();
  tracer.enable(false);
  tracer.clear();
  ASSERT_EQ(spans.size(), 2u);
  const Span* gpu_span = spans[0].device == "cuda:0" ? &spans[0] : &spans[1];
  EXPECT_EQ(gpu_span->device, "cuda:0");
  EXPECT_EQ(gpu_span->name, "forward");
  EXPECT_EQ(gpu_span->ids.stage, 0);
  EXPECT_EQ(gpu_span->ids.micro_batch, 1);
  EXPECT_GE(gpu_span->end_us, gpu_span->start_us);
  // The GPU ran the scope's work after the host queued it: the anchor maps GPU times no earlier
  // than they happened.
  EXPECT_GE(gpu_span->start_us, before);
}

TEST(TraceCuda, DisabledTracerRecordsNoEvents) {
  KILN_SKIP_WITHOUT_CUDA();
  Tracer::global().clear();
  { Scope s("forward", Phase::Forward, Device(DeviceType::CUDA, 0)); }
  EXPECT_TRUE(Tracer::global().spans().empty());
}

}  // namespace
}  // namespace kiln::trace
