// Pipeline model parallelism: partitions, schedules, and training equivalence on CPU devices.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/local_transport.h"
#include "engine/trace.h"
#include "engine/optim/sgd.h"
#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "models/pipeline/pipeline.h"
#include "models/pipeline/schedule.h"
#include "models/resnet.h"
#include "pipeline_test_util.h"

namespace kiln {
namespace {

// ---- Partitions. ---------------------------------------------------------------------------

double max_stage_cost(const Partition& p, const std::vector<double>& costs) {
  double worst = 0;
  for (int s = 0; s < p.stages(); ++s) {
    double c = 0;
    for (int64_t b = p.first(s); b < p.end(s); ++b) c += costs[b];
    worst = std::max(worst, c);
  }
  return worst;
}

// Every way of cutting n blocks into p non-empty runs, the best largest-run cost.
double brute_force_best(const std::vector<double>& costs, int p) {
  const int n = static_cast<int>(costs.size());
  double best = INFINITY;
  std::vector<int64_t> starts(p);
  std::function<void(int, int64_t)> place = [&](int s, int64_t from) {
    if (s == p) {
      Partition part = partition_at(n, starts);
      best = std::min(best, max_stage_cost(part, costs));
      return;
    }
    for (int64_t b = from; b <= n - (p - s); ++b) {
      starts[s] = b;
      place(s + 1, b + 1);
    }
  };
  starts[0] = 0;
  place(1, 1);
  if (p == 1) best = max_stage_cost(partition_at(n, {0}), costs);
  return best;
}

void expect_covers_every_block_in_order(const Partition& p, int64_t n) {
  ASSERT_GE(p.stages(), 1);
  EXPECT_EQ(p.bounds.front(), 0);
  EXPECT_EQ(p.bounds.back(), n);
  for (int s = 0; s < p.stages(); ++s) EXPECT_LT(p.first(s), p.end(s)) << "stage " << s;
}

TEST(Partition, BalancedEqualsTheBruteForceOptimum) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0.5, 10.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9);
    const int p = 1 + static_cast<int>(rng() % std::min(n, 4));
    std::vector<double> costs(n);
    for (double& c : costs) c = trial % 5 == 0 ? 1.0 : cost(rng);  // ties too
    Partition part = balance(costs, p);
    expect_covers_every_block_in_order(part, n);
    ASSERT_EQ(part.stages(), p);
    EXPECT_DOUBLE_EQ(max_stage_cost(part, costs), brute_force_best(costs, p))
        << "n " << n << " p " << p << " trial " << trial;
  }
}

TEST(Partition, BadCutsAreUsageErrorsThatSayWhy) {
  auto usage_message = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(usage_message([] { partition_at(5, {1, 3}); }).find("block 0"), std::string::npos);
  EXPECT_NE(usage_message([] { partition_at(5, {0, 3, 3}); }).find("every stage needs a block"),
            std::string::npos);
  EXPECT_NE(usage_message([] { partition_at(5, {0, 5}); }).find("5 blocks"), std::string::npos);
  EXPECT_NE(usage_message([] { balance({1, 2}, 3); }).find("3 non-empty stages"),
            std::string::npos);
}

TEST(Partition, TutorialCutOfResNet50IsConv1ToLayer2ThenLayer3ToFc) {
  ResNetConfig c = resnet_config("resnet50", 10);
  c.width_per_group = 16;
  c.base_planes = 4;  // the same depth, tiny
  auto model = make_resnet(c);
  std::vector<Block> blocks = resnet_blocks(*model);
  ASSERT_EQ(blocks.size(), 1u + 3 + 4 + 6 + 3 + 1);
  Partition p = tutorial_partition(blocks);
  ASSERT_EQ(p.stages(), 2);
  EXPECT_EQ(blocks[p.first(0)].name, "stem");
  EXPECT_EQ(blocks[p.end(0) - 1].name, "layer2.3");
  EXPECT_EQ(blocks[p.first(1)].name, "layer3.0");
  EXPECT_EQ(blocks[p.end(1) - 1].name, "head");
  std::string plan = describe(p, blocks, {Device("cpu:0"), Device("cpu:1")});
  EXPECT_NE(plan.find("stem .. layer2.3"), std::string::npos) << plan;
  EXPECT_NE(plan.find("cpu:1"), std::string::npos) << plan;
  // The parameter-balanced cut of the same blocks is also a valid cover.
  expect_covers_every_block_in_order(balance(parameter_costs(blocks), 3), 18);
}

// ---- Schedules: tests/models/schedule_test.cpp. ----------------------------------------------

// ---- Training equivalence on CPU devices. ---------------------------------------------------

struct PipeSetup {
  Schedule schedule;
  int64_t split;
  bool recompute;
  int chunks = 1;
};

std::string name_of(const PipeSetup& s) {
  return std::string(schedule_name(s.schedule)) + " split " + std::to_string(s.split) +
         (s.recompute ? " recompute" : "") +
         (s.chunks > 1 ? " chunks " + std::to_string(s.chunks) : "");
}

using test::cpu_devices;
using test::mse;

// Every setup on 2 and 3 CPU stages, three SGD steps with momentum, against the same `blocks`
// MLP blocks on one device on the whole batch: the same losses and weights, up to the order
// in which the micro-batches' gradients are summed.
void expect_every_setup_equals_one_device(const std::vector<PipeSetup>& setups, int64_t batch,
                                          int blocks) {
  Tensor x = test::random_tensor({batch, 6}, 1), y = test::random_tensor({batch, 3}, 2);
  test::MlpBlocks reference(11, 16, blocks);
  SGD ref_opt(reference.parameters(), 0.1, 0.9);
  std::vector<Tensor> ref_losses;
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    Tensor loss = mse_loss(reference.forward(x), y);
    loss.backward();
    ref_opt.step();
    ref_losses.push_back(loss.detach());
  }
  for (const PipeSetup& setup : setups) {
    for (int stages : {2, 3}) {
      SCOPED_TRACE(name_of(setup) + ", " + std::to_string(stages) + " stages");
      test::MlpBlocks model(11, 16, blocks);
      PipelineOptions options;
      options.schedule = setup.schedule;
      options.split_size = setup.split;
      options.recompute = setup.recompute;
      options.chunks = setup.chunks;
      Pipeline pipe(model.blocks(),
                    balance(std::vector<double>(model.blocks().size(), 1.0), stages * setup.chunks),
                    cpu_devices(stages), mse(),
                    [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.1, 0.9); },
                    options);
      ASSERT_EQ(pipe.stages(), stages);
      ASSERT_EQ(pipe.pieces(), stages * setup.chunks);
      for (int step = 0; step < 3; ++step) {
        double loss = pipe.train_step(x, y, step);
        EXPECT_NEAR(loss, ref_losses[step].item(), 1e-5) << "step " << step;
      }
      test::expect_same_parameters(model, reference, 1e-5);
    }
  }
}

TEST(PipelineCpu, EverySchedulesGradientsAndWeightsEqualOneDevice) {
  expect_every_setup_equals_one_device(
      {{Schedule::Naive, 0, false},
       {Schedule::GPipe, 1, false},
       {Schedule::GPipe, 3, false},
       {Schedule::GPipe, 10, false},
       {Schedule::OneFOneB, 1, false},
       {Schedule::OneFOneB, 4, false},
       {Schedule::GPipe, 3, true},
       {Schedule::OneFOneB, 2, true}},
      /*batch=*/10, /*blocks=*/5);
}

// The zero-bubble schedules (B and W apart) and the interleaved one (two chunks per device:
// 4 or 6 pieces of 7 blocks), on 1, 2, 4, 6 and 12 micro-batches.
TEST(PipelineCpu, SplitBackwardAndInterleavedSchedulesEqualOneDevice) {
  expect_every_setup_equals_one_device(
      {{Schedule::ZeroBubbleH1, 1, false},
       {Schedule::ZeroBubbleH1, 3, false},
       {Schedule::ZeroBubbleH1, 12, false},
       {Schedule::ZeroBubbleH1, 2, true},
       {Schedule::ZeroBubbleH2, 1, false},
       {Schedule::ZeroBubbleH2, 6, false},
       {Schedule::ZeroBubbleH2, 2, true},
       {Schedule::Interleaved, 2, false, 2},
       {Schedule::Interleaved, 1, false, 2},
       {Schedule::Interleaved, 2, true, 2}},
      /*batch=*/12, /*blocks=*/7);
}

TEST(PipelineCpu, OneFOneBHoldsFewerActivationsThanGPipe) {
  Tensor x = test::random_tensor({32, 6}, 1), y = test::random_tensor({32, 3}, 2);
  auto run = [&](Schedule sched, bool recompute) {
    test::MlpBlocks model(3, /*width=*/256);
    PipelineOptions options;
    options.schedule = sched;
    options.split_size = 4;  // m = 8
    options.recompute = recompute;
    Pipeline pipe(model.blocks(), balance(std::vector<double>(model.blocks().size(), 1.0), 2),
                  {Device("cpu:0"), Device("cpu:1")},
                  [](const Tensor& out, const Tensor& t) { return mse_loss(out, t); },
                  [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.01); }, options);
    pipe.train_step(x, y);
    pipe.train_step(x, y);  // the second step, with the allocator warm
    return pipe.last_step();
  };
  PipelineStepStats gpipe = run(Schedule::GPipe, false);
  PipelineStepStats one_f_one_b = run(Schedule::OneFOneB, false);
  PipelineStepStats remat = run(Schedule::GPipe, true);
  EXPECT_EQ(gpipe.micro_batches, 8);
  EXPECT_EQ(gpipe.peak_live_micro_batches, (std::vector<int>{8, 8}));
  EXPECT_EQ(one_f_one_b.peak_live_micro_batches, (std::vector<int>{2, 1}));
  EXPECT_LT(one_f_one_b.peak_activation_bytes[0], gpipe.peak_activation_bytes[0]);
  EXPECT_LT(remat.peak_activation_bytes[0], gpipe.peak_activation_bytes[0]);
}

// Every stage records a forward and a backward span per micro-batch, labelled with its
// stage, micro-batch and step: what the bubble figure and the Gantt chart are computed from.
TEST(PipelineCpu, TracesEveryStageAndMicroBatch) {
  trace::Tracer& tracer = trace::Tracer::global();
  tracer.clear();
  tracer.enable();
  test::MlpBlocks model(3);
  PipelineOptions options;
  options.schedule = Schedule::OneFOneB;
  options.split_size = 2;
  Pipeline pipe(model.blocks(), balance(std::vector<double>(5, 1.0), 2),
                {Device("cpu:0"), Device("cpu:1")},
                [](const Tensor& out, const Tensor& t) { return mse_loss(out, t); },
                [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.01); }, options);
  pipe.train_step(test::random_tensor({8, 6}, 1), test::random_tensor({8, 3}, 2), /*step=*/7);
  tracer.enable(false);
  std::vector<trace::Span> spans = tracer.spans();
  tracer.clear();
  for (int s = 0; s < 2; ++s) {
    for (trace::Phase phase : {trace::Phase::Forward, trace::Phase::Backward}) {
      std::vector<int> micro_batches;
      for (const trace::Span& span : spans) {
        if (span.phase == phase && span.ids.stage == s) {
          EXPECT_EQ(span.ids.step, 7);
          EXPECT_EQ(span.device, "cpu:" + std::to_string(s));
          micro_batches.push_back(span.ids.micro_batch);
        }
      }
      std::sort(micro_batches.begin(), micro_batches.end());
      EXPECT_EQ(micro_batches, (std::vector<int>{0, 1, 2, 3}))
          << "stage " << s << " " << trace::phase_name(phase);
    }
  }
  trace::StageUtilisation u = trace::stage_utilisation(spans, 2, 7);
  EXPECT_GT(u.window_us, 0);
  EXPECT_GT(u.bubble_fraction, 0);
  EXPECT_LT(u.bubble_fraction, 1);
}

// The stash holds a micro-batch from its forward to its W in a split backward, and a
// (chunk, micro-batch) pair in the interleaved schedule: the peaks are the schedules'.
TEST(PipelineCpu, PeakLiveMicroBatchesAreTheSchedulesPeakInFlight) {
  Tensor x = test::random_tensor({16, 6}, 1), y = test::random_tensor({16, 3}, 2);
  struct Case {
    Schedule schedule;
    int stages, chunks;
  };
  for (const Case& c : {Case{Schedule::ZeroBubbleH1, 2, 1}, Case{Schedule::ZeroBubbleH1, 3, 1},
                        Case{Schedule::ZeroBubbleH2, 3, 1}, Case{Schedule::Interleaved, 2, 2}}) {
    SCOPED_TRACE(std::string(schedule_name(c.schedule)) + ", " + std::to_string(c.stages) +
                 " stages");
    test::MlpBlocks model(3, 16, 6);
    PipelineOptions options;
    options.schedule = c.schedule;
    options.split_size = 2;  // m = 8
    options.chunks = c.chunks;
    Pipeline pipe(model.blocks(), balance(std::vector<double>(6, 1.0), c.stages * c.chunks),
                  cpu_devices(c.stages), mse(),
                  [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.01); }, options);
    pipe.train_step(x, y);
    std::vector<int> want;
    for (int s = 0; s < c.stages; ++s) {
      want.push_back(peak_in_flight(stage_actions(c.schedule, s, c.stages, 8, c.chunks)));
    }
    EXPECT_EQ(pipe.last_step().micro_batches, 8);
    EXPECT_EQ(pipe.last_step().peak_live_micro_batches, want);
  }
}

// The spans of `phase` on `stage` as sorted (chunk, micro-batch) pairs, each checked to carry
// the step and the stage's device.
std::vector<std::pair<int, int>> traced(const std::vector<trace::Span>& spans,
                                        trace::Phase phase, int stage, int64_t step) {
  std::vector<std::pair<int, int>> got;
  for (const trace::Span& span : spans) {
    if (span.phase != phase || span.ids.stage != stage) continue;
    EXPECT_EQ(span.ids.step, step);
    EXPECT_EQ(span.device, "cpu:" + std::to_string(stage));
    got.emplace_back(span.ids.chunk, span.ids.micro_batch);
  }
  std::sort(got.begin(), got.end());
  return got;
}

std::vector<trace::Span> trace_one_step(Pipeline& pipe, int64_t rows, int64_t step) {
  trace::Tracer& tracer = trace::Tracer::global();
  tracer.clear();
  tracer.enable();
  pipe.train_step(test::random_tensor({rows, 6}, 1), test::random_tensor({rows, 3}, 2), step);
  tracer.enable(false);
  std::vector<trace::Span> spans = tracer.spans();
  tracer.clear();
  return spans;
}

// A split backward records one "backward" (B) and one "weight" (W) span per micro-batch and
// stage, W after B.
TEST(PipelineCpu, ZeroBubbleSchedulesTraceOneWeightSpanPerMicroBatchAndStage) {
  for (Schedule sched : {Schedule::ZeroBubbleH1, Schedule::ZeroBubbleH2}) {
    SCOPED_TRACE(schedule_name(sched));
    test::MlpBlocks model(3);
    PipelineOptions options;
    options.schedule = sched;
    options.split_size = 2;
    Pipeline pipe(model.blocks(), balance(std::vector<double>(5, 1.0), 2), cpu_devices(2), mse(),
                  [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.01); }, options);
    std::vector<trace::Span> spans = trace_one_step(pipe, 8, 4);
    const std::vector<std::pair<int, int>> every = {{-1, 0}, {-1, 1}, {-1, 2}, {-1, 3}};
    for (int s = 0; s < 2; ++s) {
      for (trace::Phase phase :
           {trace::Phase::Forward, trace::Phase::Backward, trace::Phase::Weight}) {
        EXPECT_EQ(traced(spans, phase, s, 4), every) << "stage " << s << " "
                                                     << trace::phase_name(phase);
      }
      for (const trace::Span& w : spans) {
        if (w.phase != trace::Phase::Weight || w.ids.stage != s) continue;
        EXPECT_EQ(w.name, "weight");
        for (const trace::Span& b : spans) {
          if (b.phase == trace::Phase::Backward && b.ids.stage == s &&
              b.ids.micro_batch == w.ids.micro_batch) {
            EXPECT_LE(b.end_us, w.start_us) << "W " << w.ids.micro_batch << " before its B";
          }
        }
      }
    }
  }
}

// Interleaved: every device runs a forward and a backward of each micro-batch in each of its
// chunks, and the spans say which chunk.
TEST(PipelineCpu, InterleavedTracesEveryChunkOfEveryStage) {
  test::MlpBlocks model(3, 16, 6);
  PipelineOptions options;
  options.schedule = Schedule::Interleaved;
  options.chunks = 2;
  options.split_size = 2;
  Pipeline pipe(model.blocks(), balance(std::vector<double>(6, 1.0), 4), cpu_devices(2), mse(),
                [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.01); }, options);
  EXPECT_EQ(pipe.stages(), 2);
  EXPECT_EQ(pipe.chunks(), 2);
  EXPECT_EQ(pipe.pieces(), 4);
  // Device 0 holds pieces 0 and 2, device 1 pieces 1 and 3.
  std::vector<Tensor> want0, want1;
  for (int k : {0, 2, 1, 3}) {
    for (int64_t b = pipe.partition().first(k); b < pipe.partition().end(k); ++b) {
      for (const Tensor& t : model.blocks()[b].module->parameters()) {
        (k % 2 == 0 ? want0 : want1).push_back(t);
      }
    }
  }
  auto same_tensors = [](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].impl() != b[i].impl()) return false;
    }
    return true;
  };
  EXPECT_TRUE(same_tensors(pipe.stage_parameters(0), want0));
  EXPECT_TRUE(same_tensors(pipe.stage_parameters(1), want1));
  std::vector<trace::Span> spans = trace_one_step(pipe, 8, 2);
  std::vector<std::pair<int, int>> every;
  for (int c = 0; c < 2; ++c) {
    for (int i = 0; i < 4; ++i) every.emplace_back(c, i);
  }
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(traced(spans, trace::Phase::Forward, s, 2), every) << "stage " << s;
    EXPECT_EQ(traced(spans, trace::Phase::Backward, s, 2), every) << "stage " << s;
    EXPECT_TRUE(traced(spans, trace::Phase::Weight, s, 2).empty()) << "stage " << s;
  }
}

using test::FailOnCall;

TEST(PipelineCpu, AFailingStageEndsTheStepWithItsErrorNotAHang) {
  for (Schedule sched : {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZeroBubbleH1}) {
    SCOPED_TRACE(schedule_name(sched));
    test::MlpBlocks model(5);
    std::vector<Block> blocks = model.blocks();
    auto bomb = std::make_shared<FailOnCall>(2);  // the third forward: micro-batch 2
    blocks.insert(blocks.begin() + 3, Block{"bomb", bomb});
    PipelineOptions options;
    options.schedule = sched;
    options.split_size = 2;
    Pipeline pipe(blocks, partition_at(static_cast<int64_t>(blocks.size()), {0, 2, 4}),
                  {Device("cpu:0"), Device("cpu:1"), Device("cpu:2")},
                  [](const Tensor& out, const Tensor& t) { return mse_loss(out, t); },
                  [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.1); }, options);
    Tensor x = test::random_tensor({10, 6}, 1), y = test::random_tensor({10, 3}, 2);
    auto result = std::async(std::launch::async, [&] {
      try {
        pipe.train_step(x, y);
      } catch (const Error& e) {
        return std::make_pair(std::string(e.what()), e.kind());
      }
      return std::make_pair(std::string("no error"), ErrorKind::Runtime);
    });
    ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "the pipeline hung after a stage failed";
    auto [message, kind] = result.get();
    EXPECT_NE(message.find("pipeline stage 1 (cpu:1), micro-batch 2, forward: planted failure"),
              std::string::npos)
        << message;
    EXPECT_EQ(kind, ErrorKind::Input);
    bomb->disarm();
    EXPECT_TRUE(std::isfinite(pipe.train_step(x, y))) << "the next step runs";
    pipe.submit_step(x, y);  // and so do overlapping ones (pipeline_overlap_test.cpp)
    pipe.submit_step(x, y);
    EXPECT_TRUE(std::isfinite(pipe.wait_step()));
    EXPECT_TRUE(std::isfinite(pipe.wait_step()));
  }
}

TEST(PipelineCpu, MismatchedDevicesOrBatchesAreUsageErrors) {
  test::MlpBlocks model(5);
  auto make = [&](std::vector<Device> devices) {
    return std::make_unique<Pipeline>(
        model.blocks(), balance(std::vector<double>(model.blocks().size(), 1.0), 2), devices,
        [](const Tensor& out, const Tensor& t) { return mse_loss(out, t); },
        [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.1); });
  };
  EXPECT_THROW(make({Device("cpu:0")}), Error);
  auto pipe = make({Device("cpu:0"), Device("cpu:1")});
  EXPECT_THROW(pipe->train_step(test::random_tensor({4, 6}, 1), test::random_tensor({5, 3}, 2)),
               Error);
}

TEST(PipelineCpu, BadChunkCountsAreUsageErrorsThatSayWhy) {
  test::MlpBlocks model(5);
  auto usage_message = [&](Schedule schedule, int chunks, int pieces) {
    PipelineOptions options;
    options.schedule = schedule;
    options.chunks = chunks;
    try {
      Pipeline pipe(model.blocks(), balance(std::vector<double>(5, 1.0), pieces), cpu_devices(2),
                    mse(), [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.1); },
                    options);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(usage_message(Schedule::Interleaved, 0, 2).find("chunks must be at least 1, got 0"),
            std::string::npos);
  EXPECT_NE(usage_message(Schedule::OneFOneB, 2, 4)
                .find("chunks = 2 needs the interleaved schedule, not 1f1b"),
            std::string::npos);
  const std::string mismatch = usage_message(Schedule::Interleaved, 2, 3);
  EXPECT_NE(mismatch.find("2 devices x 2 chunks need a partition into 4 pieces, but it has 3"),
            std::string::npos)
      << mismatch;
}

// A ResNet with BatchNorm in eval mode (running statistics: micro-batches do not change it).
TEST(PipelineCpu, ResNetInEvalModeMatchesOneDevice) {
  ResNetConfig c = resnet_config("resnet18", 5);
  c.base_planes = 8;
  c.width_per_group = 8;
  auto make = [&] {
    manual_seed(21);
    auto m = make_resnet(c);
    m->eval();
    return m;
  };
  auto reference = make();
  auto model = make();
  Tensor x = test::random_tensor({6, 3, 32, 32}, 4), y = test::random_tensor({6, 5}, 5);
  SGD ref_opt(reference->parameters(), 0.05);
  for (int step = 0; step < 2; ++step) {
    ref_opt.zero_grad();
    mse_loss(reference->forward(x), y).backward();
    ref_opt.step();
  }
  std::vector<Block> blocks = resnet_blocks(*model);
  PipelineOptions options;
  options.schedule = Schedule::OneFOneB;
  options.split_size = 2;
  Pipeline pipe(blocks, tutorial_partition(blocks), {Device("cpu:0"), Device("cpu:1")},
                [](const Tensor& out, const Tensor& t) { return mse_loss(out, t); },
                [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.05); }, options);
  for (int step = 0; step < 2; ++step) pipe.train_step(x, y, step);
  auto got = model->named_parameters(), want = reference->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LT(test::max_abs_diff(got[i].second, want[i].second), 2e-5) << got[i].first;
  }
}

// ---- Hybrid: 2 replicas of a 2-stage pipeline == one device on the global batch. -----------

// Replica r runs schedules[r] (each stage's allreduce meets the same stage of the other
// replica, whatever order its micro-batches ran in); chunks > 1 for the interleaved schedule.
// Each replica's 6 rows are cut into micro-batches of `split` rows.
void expect_two_replicas_of_two_stages_equal_one_device(const Schedule (&schedules)[2],
                                                       int chunks, int64_t split = 2) {
  const int replicas = 2, stages = 2;
  const int64_t batch = 12;
  Tensor x = test::random_tensor({batch, 6}, 1), y = test::random_tensor({batch, 3}, 2);
  test::MlpBlocks reference(9);
  SGD ref_opt(reference.parameters(), 0.1, 0.9);
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    mse_loss(reference.forward(x), y).backward();
    ref_opt.step();
  }
  std::vector<std::vector<std::shared_ptr<comm::Transport>>> groups;  // [stage][replica]
  for (int s = 0; s < stages; ++s) groups.push_back(comm::make_local_group(replicas));
  std::vector<std::unique_ptr<test::MlpBlocks>> models;
  // Replica 1 starts from other weights: the stage broadcasts must make them equal.
  for (int r = 0; r < replicas; ++r) models.push_back(std::make_unique<test::MlpBlocks>(r == 0 ? 9 : 99));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(replicas);
  for (int r = 0; r < replicas; ++r) {
    threads.emplace_back([&, r] {
      try {
        PipelineOptions options;
        options.schedule = schedules[r];
        options.chunks = chunks;
        options.split_size = split;
        options.replica = r;
        options.bucket_bytes = 256;  // several buckets
        for (int s = 0; s < stages; ++s) options.stage_transports.push_back(groups[s][r]);
        std::vector<Block> blocks = models[r]->blocks();
        Pipeline pipe(blocks, balance(std::vector<double>(blocks.size(), 1.0), stages * chunks),
                      {Device(DeviceType::CPU, 2 * r), Device(DeviceType::CPU, 2 * r + 1)},
                      [](const Tensor& out, const Tensor& t) { return mse_loss(out, t); },
                      [](std::vector<Tensor> p) { return std::make_unique<SGD>(p, 0.1, 0.9); },
                      options);
        const int64_t shard = batch / replicas;
        for (int step = 0; step < 3; ++step) {
          pipe.train_step(x.rows(r * shard, (r + 1) * shard), y.rows(r * shard, (r + 1) * shard),
                          step);
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < replicas; ++r) {
    ASSERT_EQ(errors[r], "") << "replica " << r;
    test::expect_same_parameters(*models[r], reference, 2e-6);
  }
}

TEST(PipelineHybrid, TwoReplicasOfTwoStagesEqualOneDeviceOnTheGlobalBatch) {
  expect_two_replicas_of_two_stages_equal_one_device({Schedule::OneFOneB, Schedule::GPipe}, 1);
}

// In a split backward the weights' gradients appear in the W actions: all but each stage's
// last accumulate under no_sync(), and the average over the replicas is still the global one.
TEST(PipelineHybrid, ZeroBubbleReplicasEqualOneDeviceOnTheGlobalBatch) {
  expect_two_replicas_of_two_stages_equal_one_device(
      {Schedule::ZeroBubbleH1, Schedule::ZeroBubbleH1}, 1);
  expect_two_replicas_of_two_stages_equal_one_device(
      {Schedule::ZeroBubbleH1, Schedule::ZeroBubbleH2}, 1);
}

// Two chunks per device: one allreduce per device over the parameters of both its chunks.
TEST(PipelineHybrid, InterleavedReplicasEqualOneDeviceOnTheGlobalBatch) {
  expect_two_replicas_of_two_stages_equal_one_device(
      {Schedule::Interleaved, Schedule::Interleaved}, 2, /*split=*/3);
}

}  // namespace
}  // namespace kiln
