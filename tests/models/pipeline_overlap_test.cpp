// Consecutive pipeline steps that overlap (submit_step / wait_step, models/pipeline/pipeline.h):
// the same losses and weights as step-by-step training, bit for bit, and what a failure does
// to the steps in flight.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/sgd.h"
#include "layers/loss.h"
#include "models/pipeline/partition.h"
#include "models/pipeline/pipeline.h"
#include "models/pipeline/schedule.h"
#include "pipeline_test_util.h"

namespace kiln {
namespace {

struct OverlapSetup {
  Schedule schedule;
  int chunks = 1;
};

using test::cpu_devices;
using test::mse;

Pipeline::OptimizerFactory sgd_momentum() {
  return [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.1, 0.9); };
}

std::unique_ptr<Pipeline> make_pipeline(const std::vector<Block>& blocks, OverlapSetup setup,
                                        int stages) {
  PipelineOptions options;
  options.schedule = setup.schedule;
  options.split_size = 2;
  options.chunks = setup.chunks;
  return std::make_unique<Pipeline>(
      blocks, balance(std::vector<double>(blocks.size(), 1.0), stages * setup.chunks),
      cpu_devices(stages), mse(), sgd_momentum(), options);
}

void expect_bit_identical(const test::MlpBlocks& got, const test::MlpBlocks& want) {
  std::vector<Tensor> g = got.parameters(), w = want.parameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i].to_vector<float>(), w[i].to_vector<float>()) << "parameter " << i;
  }
}

// Three steps submitted at once, then waited for, run on every stage the operations of three
// train_step calls in the same order: the losses and weights are exactly equal.
TEST(PipelineOverlap, ThreeSubmittedStepsEqualThreeTrainStepsBitForBit) {
  const std::vector<OverlapSetup> setups = {{Schedule::GPipe},        {Schedule::OneFOneB},
                                     {Schedule::ZeroBubbleH1}, {Schedule::ZeroBubbleH2},
                                     {Schedule::Interleaved, 2}};
  std::vector<Tensor> xs, ys;  // a different batch per step; kept until the steps are waited for
  for (uint32_t step = 0; step < 3; ++step) {
    xs.push_back(test::random_tensor({10, 6}, 1 + 2 * step));
    ys.push_back(test::random_tensor({10, 3}, 2 + 2 * step));
  }
  for (const OverlapSetup& setup : setups) {
    for (int stages : {2, 3}) {
      SCOPED_TRACE(std::string(schedule_name(setup.schedule)) + " chunks " +
                   std::to_string(setup.chunks) + ", " + std::to_string(stages) + " stages");
      test::MlpBlocks stepped(11, 16, 6), overlapped(11, 16, 6);
      expect_bit_identical(overlapped, stepped);
      std::vector<double> want;
      {
        auto pipe = make_pipeline(stepped.blocks(), setup, stages);
        for (int step = 0; step < 3; ++step) want.push_back(pipe->train_step(xs[step], ys[step]));
      }
      auto pipe = make_pipeline(overlapped.blocks(), setup, stages);
      for (int step = 0; step < 3; ++step) {
        EXPECT_EQ(pipe->submit_step(xs[step], ys[step], step), step);
      }
      EXPECT_EQ(pipe->steps_submitted_not_waited(), 3);
      for (int step = 0; step < 3; ++step) {
        EXPECT_EQ(pipe->wait_step(), want[step]) << "step " << step;
        EXPECT_EQ(pipe->last_step().loss, want[step]);
        EXPECT_EQ(pipe->last_step().micro_batches, 5);
        EXPECT_EQ(pipe->last_step().peak_live_micro_batches.size(), static_cast<size_t>(stages));
      }
      EXPECT_EQ(pipe->steps_submitted_not_waited(), 0);
      expect_bit_identical(overlapped, stepped);
    }
  }
}

// Stage 0 starts step k+1 without waiting for the other stages to end step k: the last stage's
// optimizer step of step 0 is held until stage 0 has run the first forward of step 1 (or 20 s
// have passed, which fails the test instead of hanging it).
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// An identity block that opens the gate on its call number `call`.
class OpenOnCall : public Module {
 public:
  OpenOnCall(int call, Gate& gate) : call_(call), gate_(gate) {}
  Tensor forward(const Tensor& x) override {
    if (calls_++ == call_) gate_.open();
    return x;
  }
  std::string type_name() const override { return "OpenOnCall"; }

 private:
  int call_;
  Gate& gate_;
  int calls_ = 0;
};

// SGD whose first step waits for the gate (and remembers whether it opened).
class GatedSgd : public Optimizer {
 public:
  GatedSgd(std::vector<Tensor> params, Gate& gate)
      : Optimizer(params, 0.1), sgd_(params, 0.1, 0.9), gate_(gate) {}
  const char* name() const override { return "GatedSgd"; }
  std::vector<std::string> buffer_names() const override { return {}; }
  bool opened = false;

 private:
  void update(size_t i, const Tensor&, const int32_t*) override {
    if (i != 0) return;  // the whole step is sgd_'s, on parameter 0's turn
    if (steps_++ == 0) opened = gate_.wait();
    sgd_.step();
  }
  SGD sgd_;
  Gate& gate_;
  int steps_ = 0;
};

TEST(PipelineOverlap, StageZeroStartsTheNextStepBeforeTheLastStageEndsThisOne) {
  Tensor x = test::random_tensor({10, 6}, 1), y = test::random_tensor({10, 3}, 2);
  for (Schedule sched : {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZeroBubbleH1,
                         Schedule::ZeroBubbleH2}) {
    SCOPED_TRACE(schedule_name(sched));
    test::MlpBlocks model(5);
    Gate gate;
    std::vector<Block> blocks = model.blocks();
    // Five micro-batches a step: call 5 is the first forward of the second step.
    blocks.insert(blocks.begin(), Block{"gate", std::make_shared<OpenOnCall>(5, gate)});
    GatedSgd* last_stage_sgd = nullptr;
    int made = 0;
    PipelineOptions options;
    options.schedule = sched;
    options.split_size = 2;
    Pipeline pipe(blocks, partition_at(static_cast<int64_t>(blocks.size()), {0, 3}),
                  cpu_devices(2), mse(),
                  [&](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
                    if (made++ == 0) return std::make_unique<SGD>(p, 0.1, 0.9);
                    auto gated = std::make_unique<GatedSgd>(p, gate);
                    last_stage_sgd = gated.get();
                    return gated;
                  },
                  options);
    pipe.submit_step(x, y);
    pipe.submit_step(x, y);
    EXPECT_TRUE(std::isfinite(pipe.wait_step()));
    EXPECT_TRUE(std::isfinite(pipe.wait_step()));
    ASSERT_NE(last_stage_sgd, nullptr);
    EXPECT_TRUE(last_stage_sgd->opened)
        << "stage 0 waited for the last stage to end step 0 before starting step 1";
  }
}

using test::FailOnCall;

struct Outcome {
  double loss = NAN;
  std::string error;  // empty: no error
  ErrorKind kind = ErrorKind::Runtime;
};

Outcome wait_outcome(Pipeline& pipe) {
  Outcome o;
  try {
    o.loss = pipe.wait_step();
  } catch (const Error& e) {
    o.error = e.what();
    o.kind = e.kind();
  }
  return o;
}

// Stage 1 fails in the second of three submitted steps: the first ends normally (its loss is
// that of a step-by-step run), the second throws the failure, the third was cancelled, and the
// pipeline then runs new steps.
TEST(PipelineOverlap, AFailureEndsItsStepCancelsTheLaterOnesAndThePipelineGoesOn) {
  for (Schedule sched : {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZeroBubbleH1,
                         Schedule::ZeroBubbleH2}) {
    SCOPED_TRACE(schedule_name(sched));
    Tensor x = test::random_tensor({10, 6}, 1), y = test::random_tensor({10, 3}, 2);
    double want_first = 0;
    {
      test::MlpBlocks model(5);
      auto pipe = make_pipeline(model.blocks(), {sched}, 3);
      want_first = pipe->train_step(x, y);
    }
    test::MlpBlocks model(5);
    std::vector<Block> blocks = model.blocks();
    // Five micro-batches a step: call 7 is the forward of micro-batch 2 in the second step.
    auto bomb = std::make_shared<FailOnCall>(7);
    blocks.insert(blocks.begin() + 3, Block{"bomb", bomb});
    PipelineOptions options;
    options.schedule = sched;
    options.split_size = 2;
    Pipeline pipe(blocks, partition_at(static_cast<int64_t>(blocks.size()), {0, 2, 4}),
                  cpu_devices(3), mse(), sgd_momentum(), options);
    auto outcomes = std::async(std::launch::async, [&] {
      for (int step = 0; step < 3; ++step) pipe.submit_step(x, y, step);
      std::vector<Outcome> o;
      for (int step = 0; step < 3; ++step) o.push_back(wait_outcome(pipe));
      return o;
    });
    ASSERT_EQ(outcomes.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "the pipeline hung after a stage failed";
    std::vector<Outcome> o = outcomes.get();
    EXPECT_EQ(o[0].error, "");
    EXPECT_EQ(o[0].loss, want_first) << "the step before the failure ends normally";
    EXPECT_NE(o[1].error.find("pipeline stage 1 (cpu:1), micro-batch 2, forward: planted failure"),
              std::string::npos)
        << o[1].error;
    EXPECT_EQ(o[1].kind, ErrorKind::Input);
    EXPECT_NE(o[2].error.find("step 2 was cancelled because step 1 failed"), std::string::npos)
        << o[2].error;
    EXPECT_NE(o[2].error.find("planted failure"), std::string::npos) << o[2].error;

    bomb->disarm();
    EXPECT_TRUE(std::isfinite(pipe.train_step(x, y))) << "the next step runs";
    pipe.submit_step(x, y);
    pipe.submit_step(x, y);
    EXPECT_TRUE(std::isfinite(pipe.wait_step()));
    EXPECT_TRUE(std::isfinite(pipe.wait_step()));
  }
}

TEST(PipelineOverlap, WaitingWithNothingSubmittedOrTrainingWithStepsInFlightAreUsageErrors) {
  test::MlpBlocks model(5);
  auto pipe = make_pipeline(model.blocks(), {Schedule::OneFOneB}, 2);
  Tensor x = test::random_tensor({6, 6}, 1), y = test::random_tensor({6, 3}, 2);
  try {
    pipe->wait_step();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("no step submitted"), std::string::npos) << e.what();
  }
  pipe->submit_step(x, y);
  try {
    pipe->train_step(x, y);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("wait_step"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::isfinite(pipe->wait_step()));
}

// Destroying a pipeline with steps in flight, or with a failed one, neither hangs nor crashes.
TEST(PipelineOverlap, DestroyingAPipelineWithStepsInFlightEndsThem) {
  Tensor x = test::random_tensor({10, 6}, 1), y = test::random_tensor({10, 3}, 2);
  for (int fail_at : {-1, 3}) {
    SCOPED_TRACE("fail at call " + std::to_string(fail_at));
    test::MlpBlocks model(5);
    auto done = std::async(std::launch::async, [&] {
      std::vector<Block> blocks = model.blocks();
      blocks.insert(blocks.begin() + 3, Block{"bomb", std::make_shared<FailOnCall>(fail_at)});
      PipelineOptions options;
      options.schedule = Schedule::ZeroBubbleH2;
      options.split_size = 2;
      Pipeline pipe(blocks, partition_at(static_cast<int64_t>(blocks.size()), {0, 3}),
                    cpu_devices(2), mse(), sgd_momentum(), options);
      for (int step = 0; step < 3; ++step) pipe.submit_step(x, y, step);
      return true;
    });
    ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "the destructor hung";
    EXPECT_TRUE(done.get());
  }
}

}  // namespace
}  // namespace kiln
