// trace_test.cpp: the tracer: spans from several threads, the disabled tracer, the Chrome trace
// file, stage utilisation on hand-made spans, the theoretical bubble, and write errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "engine/error.h"
#include "engine/trace.h"

namespace kiln::trace {
namespace {

// Every test starts from an enabled, empty global tracer and leaves it disabled.
class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Tracer::global().clear();
    Tracer::global().enable();
  }
  void TearDown() override {
    Tracer::global().enable(false);
    Tracer::global().clear();
  }
};

void spin_for_us(double us) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

Span work(int stage, Phase phase, double start, double end, int64_t step = -1) {
  Span s;
  s.name = phase_name(phase);
  s.phase = phase;
  s.start_us = start;
  s.end_us = end;
  s.ids.stage = stage;
  s.ids.step = step;
  s.device = "cpu:0";
  return s;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) /
          ("kiln_trace_" + std::to_string(getpid()) + "_" + name))
      .string();
}

TEST(TracePhase, Names) {
  EXPECT_STREQ(phase_name(Phase::Forward), "forward");
  EXPECT_STREQ(phase_name(Phase::LoaderWait), "loader_wait");
  EXPECT_STREQ(phase_name(Phase::HostToDevice), "h2d");
  EXPECT_STREQ(phase_name(Phase::Allreduce), "allreduce");
  EXPECT_STREQ(phase_name(Phase::Other), "other");
}

TEST_F(TraceTest, ScopeRecordsItsInterval) {
  const double before = Tracer::global().now_us();
  {
    Scope s("forward", Phase::Forward, Device(), Ids{1, 2, -1, 7, 0});
    spin_for_us(200);
  }
  const double after = Tracer::global().now_us();
  const std::vector<Span> spans = Tracer::global().spans();
  ASSERT_EQ(spans.size(), 1u);
  const Span& s = spans[0];
  EXPECT_EQ(s.name, "forward");
  EXPECT_EQ(s.phase, Phase::Forward);
  EXPECT_EQ(s.device, "cpu:0");
  EXPECT_EQ(s.ids.stage, 1);
  EXPECT_EQ(s.ids.micro_batch, 2);
  EXPECT_EQ(s.ids.bucket, -1);
  EXPECT_EQ(s.ids.step, 7);
  EXPECT_EQ(s.ids.replica, 0);
  EXPECT_GE(s.start_us, before);
  EXPECT_LE(s.end_us, after);
  EXPECT_GE(s.end_us - s.start_us, 200.0);
}

TEST_F(TraceTest, SpansFromSeveralThreadsHaveDistinctThreadIds) {
  constexpr int kThreads = 4, kSpansEach = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kSpansEach; ++i) {
        Scope s("forward", Phase::Forward, Device(), Ids{t, i});
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const std::vector<Span> spans = Tracer::global().spans();
  ASSERT_EQ(spans.size(), static_cast<size_t>(kThreads * kSpansEach));
  std::map<int, std::set<int>> threads_of_stage;  // each stage's spans came from one thread
  for (const Span& s : spans) threads_of_stage[s.ids.stage].insert(s.thread);
  std::set<int> ids;
  for (const auto& [stage, t] : threads_of_stage) {
    ASSERT_EQ(t.size(), 1u) << "stage " << stage;
    ids.insert(*t.begin());
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kThreads));
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].start_us, spans[i].start_us);
}

TEST_F(TraceTest, DisabledTracerRecordsNothing) {
  Tracer::global().enable(false);
  EXPECT_FALSE(Tracer::global().enabled());
  { Scope s("forward", Phase::Forward); }
  EXPECT_TRUE(Tracer::global().spans().empty());
  // A scope open when tracing is switched on records nothing either: it began disabled.
  {
    Scope s("backward", Phase::Backward);
    Tracer::global().enable();
  }
  EXPECT_TRUE(Tracer::global().spans().empty());
}

TEST_F(TraceTest, ClearDropsSpans) {
  { Scope s("forward", Phase::Forward); }
  ASSERT_EQ(Tracer::global().spans().size(), 1u);
  Tracer::global().clear();
  EXPECT_TRUE(Tracer::global().spans().empty());
  EXPECT_LT(Tracer::global().now_us(), 1e6);  // a new epoch
}

TEST_F(TraceTest, ChromeJsonHoldsCompleteEventsWithArgs) {
  Tracer& tracer = Tracer::global();
  tracer.add(work(0, Phase::Forward, 10, 30, 5));
  Span later_chunk = work(1, Phase::Backward, 40, 70, 5);
  later_chunk.ids.chunk = 1;  // an interleaved pipeline's second model chunk
  tracer.add(later_chunk);
  Span bucket;
  bucket.name = "bucket 3";
  bucket.phase = Phase::Allreduce;
  bucket.start_us = 50;
  bucket.end_us = 60;
  bucket.ids.bucket = 3;
  bucket.ids.replica = 1;
  bucket.device = "cpu:0";
  bucket.thread = 9;
  tracer.add(bucket);
  const std::string path = temp_path("trace.json");
  tracer.write_chrome_json(path);

  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  ASSERT_TRUE(doc.contains("traceEvents"));
  std::vector<nlohmann::json> complete;
  std::map<int, std::string> thread_names;
  std::string process_name;
  for (const nlohmann::json& e : doc["traceEvents"]) {
    if (e["ph"] == "X") complete.push_back(e);
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      thread_names[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
    }
    if (e["ph"] == "M" && e["name"] == "process_name") process_name = e["args"]["name"];
  }
  ASSERT_EQ(complete.size(), 3u);
  const nlohmann::json& fwd = complete[0];
  EXPECT_EQ(fwd["name"], "forward");
  EXPECT_DOUBLE_EQ(fwd["ts"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(fwd["dur"].get<double>(), 20.0);
  EXPECT_EQ(fwd["args"]["phase"], "forward");
  EXPECT_EQ(fwd["args"]["stage"], 0);
  EXPECT_EQ(fwd["args"]["step"], 5);
  EXPECT_FALSE(fwd["args"].contains("bucket"));  // ids that do not apply are left out
  EXPECT_FALSE(fwd["args"].contains("chunk"));
  EXPECT_EQ(complete[1]["args"]["chunk"], 1);
  const nlohmann::json& ar = complete[2];
  EXPECT_EQ(ar["name"], "bucket 3");
  EXPECT_EQ(ar["args"]["phase"], "allreduce");
  EXPECT_EQ(ar["args"]["bucket"], 3);
  EXPECT_EQ(ar["args"]["replica"], 1);
  EXPECT_EQ(ar["tid"], 9);
  EXPECT_EQ(process_name, "cpu:0");
  // Spans 0 and 1 were both added with thread 0 (stages 0 and 1): the row is its lowest stage.
  EXPECT_EQ(thread_names[0], "stage 0");
  EXPECT_EQ(thread_names[9], "thread 9");
}

TEST_F(TraceTest, UnwritablePathIsAnErrorNamingIt) {
  { Scope s("forward", Phase::Forward); }
  const std::string path = temp_path("no_such_dir") + "/trace.json";
  try {
    Tracer::global().write_chrome_json(path);
    FAIL() << "writing to a missing directory did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

// ---- Stage utilisation ------------------------------------------------------------------------

TEST(StageUtilisation, OverlappingSpansOfOneStageCountOnce) {
  // Stage 0: [0, 10) and [5, 20) overlap: busy 20 over the window [0, 20).
  const StageUtilisation u =
      stage_utilisation({work(0, Phase::Forward, 0, 10), work(0, Phase::Recompute, 5, 20)}, 1);
  EXPECT_DOUBLE_EQ(u.window_us, 20.0);
  ASSERT_EQ(u.busy_us.size(), 1u);
  EXPECT_DOUBLE_EQ(u.busy_us[0], 20.0);
  EXPECT_DOUBLE_EQ(u.bubble_fraction, 0.0);
}

TEST(StageUtilisation, TwoStagesWithKnownIdleTime) {
  // Stage 0 busy [0, 10) and [30, 40); stage 1 busy [10, 30). Window [0, 40): 80 stage-us,
  // 40 busy, so half of it is bubble. Other phases and spans without a stage are not work.
  std::vector<Span> spans = {work(0, Phase::Forward, 0, 10), work(1, Phase::Forward, 10, 20),
                             work(1, Phase::Backward, 20, 30), work(0, Phase::Backward, 30, 40),
                             work(0, Phase::Send, 10, 12), work(-1, Phase::Forward, -50, 100)};
  spans.push_back(work(1, Phase::Optimizer, 40, 90));
  const StageUtilisation u = stage_utilisation(spans, 2);
  EXPECT_DOUBLE_EQ(u.window_us, 40.0);
  ASSERT_EQ(u.busy_us.size(), 2u);
  EXPECT_DOUBLE_EQ(u.busy_us[0], 20.0);
  EXPECT_DOUBLE_EQ(u.busy_us[1], 20.0);
  EXPECT_DOUBLE_EQ(u.bubble_fraction, 0.5);
}

TEST(StageUtilisation, StepSelectsItsSpans) {
  const std::vector<Span> spans = {work(0, Phase::Forward, 0, 10, 1),
                                   work(1, Phase::Forward, 10, 20, 1),
                                   work(0, Phase::Forward, 100, 130, 2),
                                   work(1, Phase::Forward, 100, 130, 2)};
  const StageUtilisation one = stage_utilisation(spans, 2, 1);
  EXPECT_DOUBLE_EQ(one.window_us, 20.0);
  EXPECT_DOUBLE_EQ(one.bubble_fraction, 0.5);
  const StageUtilisation two = stage_utilisation(spans, 2, 2);
  EXPECT_DOUBLE_EQ(two.window_us, 30.0);
  EXPECT_DOUBLE_EQ(two.bubble_fraction, 0.0);
  const StageUtilisation all = stage_utilisation(spans, 2);
  EXPECT_DOUBLE_EQ(all.window_us, 130.0);
  EXPECT_DOUBLE_EQ(all.busy_us[0], 40.0);
}

TEST(StageUtilisation, NoWorkAndBadStages) {
  const StageUtilisation none = stage_utilisation({}, 3);
  EXPECT_DOUBLE_EQ(none.window_us, 0.0);
  EXPECT_EQ(none.busy_us, std::vector<double>(3, 0.0));
  EXPECT_DOUBLE_EQ(none.bubble_fraction, 0.0);
  EXPECT_THROW(stage_utilisation({}, 0), Error);
  EXPECT_THROW(stage_utilisation({work(2, Phase::Forward, 0, 1)}, 2), Error);
}

TEST(StageUtilisation, TheoreticalBubble) {
  EXPECT_DOUBLE_EQ(theoretical_bubble(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(1, 8), 0.0);
  EXPECT_THROW(theoretical_bubble(0, 8), Error);
}

// A thread's label names its rows ("rank 1"); a thread without one keeps "thread N". The label
// is kept after the thread ends (a trace is written after the ranks' threads have finished).
TEST_F(TraceTest, LabelledThreadsNameTheirRows) {
  std::string seen_inside;
  std::thread labelled([&] {
    set_thread_label("rank 1");
    seen_inside = thread_label();
    Scope s("forward", Phase::Forward);
  });
  labelled.join();
  std::thread unlabelled([] { Scope s("backward", Phase::Backward); });
  unlabelled.join();
  EXPECT_EQ(seen_inside, "rank 1");
  EXPECT_EQ(thread_label(), "");  // this thread has none

  const std::string path = temp_path("labels.json");
  Tracer::global().write_chrome_json(path);
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  std::map<int, std::string> thread_names;
  std::map<std::string, int> tid_of_span;
  for (const nlohmann::json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      thread_names[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
    }
    if (e["ph"] == "X") tid_of_span[e["name"].get<std::string>()] = e["tid"].get<int>();
  }
  ASSERT_EQ(tid_of_span.size(), 2u);
  EXPECT_EQ(thread_names[tid_of_span["forward"]], "rank 1");
  EXPECT_EQ(thread_names[tid_of_span["backward"]],
            "thread " + std::to_string(tid_of_span["backward"]));
}

}  // namespace
}  // namespace kiln::trace
