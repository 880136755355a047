// trace.cpp: the tracer's spans, their GPU timing, the Chrome trace file and stage utilisation.
#include "engine/trace.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "engine/cuda/context.h"
#include "engine/error.h"
#include "engine/output_file.h"

namespace kiln::trace {

namespace detail {

struct OpenSpan {
  Span span;
  uint64_t generation = 0;
#if KILN_WITH_CUDA
  bool on_gpu = false;  // timed by the two events below, not by the host clock
  cuda::Event begin{cuda::EventTiming::On}, end{cuda::EventTiming::On};
#endif
};

struct DeviceAnchors {
#if KILN_WITH_CUDA
  struct Anchor {
    cuda::Event event{cuda::EventTiming::On};
    double host_us = 0;  // the tracer's time when the event was known to be complete
  };
  std::map<int, Anchor> by_device;
#endif
};

}  // namespace detail

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// 0, 1, 2... for the threads of this process, in the order they first record a span (or set
// a label). Never reused, so a label keyed by it names one thread.
int this_thread_id() {
  static std::atomic<int> next{0};
  thread_local int id = next.fetch_add(1);
  return id;
}

// set_thread_label's labels, by thread id: outlive their threads (a trace is written after the
// loader's and the ranks' threads have ended).
struct ThreadLabels {
  std::mutex mu;
  std::map<int, std::string> by_thread;
};
ThreadLabels& thread_labels() {
  static ThreadLabels* labels = new ThreadLabels();  // never destroyed: threads may outlive main
  return *labels;
}

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Recompute: return "recompute";
    case Phase::Send: return "send";
    case Phase::Receive: return "receive";
    case Phase::Optimizer: return "optimizer";
    case Phase::LoaderWait: return "loader_wait";
    case Phase::HostToDevice: return "h2d";
    case Phase::Allreduce: return "allreduce";
    case Phase::Other: return "other";
    case Phase::Weight: return "weight";
  }
  return "other";
}

// ---- Tracer -----------------------------------------------------------------------------------

Tracer::Tracer() : epoch_ns_(steady_ns()), anchors_(std::make_unique<detail::DeviceAnchors>()) {}

Tracer::~Tracer() = default;

Tracer& Tracer::global() {
  // Never destroyed: scopes on other threads, and the CUDA runtime (whose events the tracer
  // may hold), may outlive static destruction order.
  static Tracer* tracer = new Tracer();
  return *tracer;
}

void Tracer::enable(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool was = enabled_.exchange(on);
  if (on && !was && spans_.empty() && pending_.empty()) {
    epoch_ns_ = steady_ns();
    anchors_ = std::make_unique<detail::DeviceAnchors>();  // they are times of the old epoch
    ++generation_;
  }
}

void Tracer::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.clear();
  pending_.clear();
  anchors_ = std::make_unique<detail::DeviceAnchors>();
  epoch_ns_ = steady_ns();
  ++generation_;
}

double Tracer::now_us() const { return static_cast<double>(steady_ns() - epoch_ns_.load()) / 1e3; }

uint64_t Tracer::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

void Tracer::add(Span span) {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(std::move(span));
}

void Tracer::add_open(std::unique_ptr<detail::OpenSpan> span) {
  std::lock_guard<std::mutex> lock(mu_);
  if (span->generation != generation_) return;  // begun before clear(): another epoch's time
#if KILN_WITH_CUDA
  if (span->on_gpu) {
    pending_.push_back(std::move(span));
    return;
  }
#endif
  spans_.push_back(std::move(span->span));
}

void Tracer::ensure_anchor(int device) {
#if KILN_WITH_CUDA
  std::lock_guard<std::mutex> lock(mu_);
  if (anchors_->by_device.count(device) > 0) return;
  detail::DeviceAnchors::Anchor& a = anchors_->by_device[device];
  try {
    cuda::DeviceGuard guard(device);
    a.event.record(cuda::current_stream());
    cuda::AllowSync allow("trace: the device's clock is anchored to the host's, once a device");
    a.event.synchronize();
  } catch (...) {
    anchors_->by_device.erase(device);
    throw;
  }
  // Read after the event completed: the GPU reached it at most the wake-up latency earlier.
  a.host_us = now_us();
#else
  (void)device;
#endif
}

void Tracer::resolve_pending_locked() const {
#if KILN_WITH_CUDA
  for (std::unique_ptr<detail::OpenSpan>& p : pending_) {
    const int device = p->begin.device();
    const auto anchor = anchors_->by_device.find(device);
    if (anchor == anchors_->by_device.end()) continue;  // cannot happen: begun after the anchor
    cuda::DeviceGuard guard(device);
    cuda::AllowSync allow("trace: a GPU span's times are read when the trace is");
    p->end.synchronize();
    // The start relative to the anchor, the length from the span's own pair of events (short,
    // so exact in float milliseconds however long after the anchor the span ran).
    Span s = std::move(p->span);
    s.start_us = anchor->second.host_us + 1e3 * anchor->second.event.elapsed_ms(p->begin);
    s.end_us = s.start_us + 1e3 * p->begin.elapsed_ms(p->end);
    spans_.push_back(std::move(s));
  }
  pending_.clear();
#endif
}

std::vector<Span> Tracer::spans() const {
  std::vector<Span> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    resolve_pending_locked();
    out = spans_;
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Span& a, const Span& b) { return a.start_us < b.start_us; });
  return out;
}

// ---- Chrome trace -----------------------------------------------------------------------------

namespace {

nlohmann::json ids_and_phase(const Span& s) {
  nlohmann::json args = {{"phase", phase_name(s.phase)}};
  if (s.ids.stage >= 0) args["stage"] = s.ids.stage;
  if (s.ids.micro_batch >= 0) args["micro_batch"] = s.ids.micro_batch;
  if (s.ids.bucket >= 0) args["bucket"] = s.ids.bucket;
  if (s.ids.step >= 0) args["step"] = s.ids.step;
  if (s.ids.replica >= 0) args["replica"] = s.ids.replica;
  if (s.ids.chunk >= 0) args["chunk"] = s.ids.chunk;
  return args;
}

nlohmann::json metadata(const char* what, int pid, int tid, const nlohmann::json& args) {
  nlohmann::json m = {{"name", what}, {"ph", "M"}, {"pid", pid}, {"args", args}};
  if (tid >= 0) m["tid"] = tid;
  return m;
}

}  // namespace

void set_thread_label(const std::string& label) {
  ThreadLabels& labels = thread_labels();
  std::lock_guard<std::mutex> lock(labels.mu);
  labels.by_thread[this_thread_id()] = label;
}

std::string thread_label() {
  ThreadLabels& labels = thread_labels();
  std::lock_guard<std::mutex> lock(labels.mu);
  auto it = labels.by_thread.find(this_thread_id());
  return it == labels.by_thread.end() ? std::string() : it->second;
}

void Tracer::write_chrome_json(const std::string& path, const std::string& what) const {
  const std::vector<Span> all = spans();
  std::map<int, std::string> labels;
  {
    ThreadLabels& l = thread_labels();
    std::lock_guard<std::mutex> lock(l.mu);
    labels = l.by_thread;
  }
  // One process per device (pid 1, 2... in the devices' name order), one row per thread in it.
  std::map<std::string, int> pid_of;
  for (const Span& s : all) pid_of.emplace(s.device.empty() ? "host" : s.device, 0);
  int next_pid = 1;
  for (auto& [device, pid] : pid_of) pid = next_pid++;
  std::map<std::pair<int, int>, int> stage_of_row;  // (pid, thread) -> lowest stage, or -1
  nlohmann::json events = nlohmann::json::array();
  for (const Span& s : all) {
    const int pid = pid_of.at(s.device.empty() ? "host" : s.device);
    auto row = stage_of_row.emplace(std::make_pair(pid, s.thread), -1).first;
    if (s.ids.stage >= 0 && (row->second < 0 || s.ids.stage < row->second)) {
      row->second = s.ids.stage;
    }
    events.push_back({{"name", s.name},
                      {"cat", phase_name(s.phase)},
                      {"ph", "X"},
                      {"ts", s.start_us},
                      {"dur", std::max(0.0, s.end_us - s.start_us)},
                      {"pid", pid},
                      {"tid", s.thread},
                      {"args", ids_and_phase(s)}});
  }
  for (const auto& [device, pid] : pid_of) {
    events.push_back(metadata("process_name", pid, -1, {{"name", device}}));
    events.push_back(metadata("process_sort_index", pid, -1, {{"sort_index", pid}}));
  }
  // Stage rows first, in stage order; then the other threads in the order they started. A
  // labelled thread's row carries its label.
  for (const auto& [row, stage] : stage_of_row) {
    const auto [pid, thread] = row;
    const auto label = labels.find(thread);
    const std::string name =
        label != labels.end() ? label->second
        : stage >= 0          ? "stage " + std::to_string(stage)
                              : "thread " + std::to_string(thread);
    events.push_back(metadata("thread_name", pid, thread, {{"name", name}}));
    events.push_back(metadata("thread_sort_index", pid, thread,
                              {{"sort_index", stage >= 0 ? stage : 1000 + thread}}));
  }
  const nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  write_output_file(what, path, doc.dump() + "\n");
}

// ---- Scope ------------------------------------------------------------------------------------

Scope::Scope(std::string name, Phase phase, Device device, Ids ids) {
  Tracer& tracer = Tracer::global();
  if (!tracer.enabled()) return;
  auto open = std::make_unique<detail::OpenSpan>();
  open->span.name = std::move(name);
  open->span.phase = phase;
  open->span.ids = ids;
  open->span.device = device.str();
  open->span.thread = this_thread_id();
  open->generation = tracer.generation();
#if KILN_WITH_CUDA
  if (device.is_cuda()) {
    try {
      tracer.ensure_anchor(device.index);
      cuda::DeviceGuard guard(device.index);
      open->begin.record(cuda::current_stream());
      open->on_gpu = true;
    } catch (const Error&) {
      // Not a device this process can use: the traced work says so itself, in its own words.
      return;
    }
  }
  if (!open->on_gpu) open->span.start_us = tracer.now_us();
#else
  open->span.start_us = tracer.now_us();
#endif
  open_ = std::move(open);
}

Scope::~Scope() {
  if (!open_) return;
  Tracer& tracer = Tracer::global();
  try {
#if KILN_WITH_CUDA
    if (open_->on_gpu) {
      cuda::DeviceGuard guard(open_->begin.device());
      open_->end.record(cuda::current_stream());
    } else {
      open_->span.end_us = tracer.now_us();
    }
#else
    open_->span.end_us = tracer.now_us();
#endif
    tracer.add_open(std::move(open_));
  } catch (...) {
    // A destructor must not throw (it may run while an exception unwinds): the span is lost,
    // and the device error surfaces at the traced work's next CUDA call.
  }
}

// ---- Stage utilisation ------------------------------------------------------------------------

namespace {

bool is_work(Phase p) {
  return p == Phase::Forward || p == Phase::Backward || p == Phase::Recompute ||
         p == Phase::Weight;
}

// Length of the union of intervals.
double union_length(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0, cur_start = 0, cur_end = 0;
  bool open = false;
  for (const auto& [s, e] : intervals) {
    if (open && s <= cur_end) {
      cur_end = std::max(cur_end, e);
      continue;
    }
    if (open) total += cur_end - cur_start;
    cur_start = s;
    cur_end = e;
    open = true;
  }
  if (open) total += cur_end - cur_start;
  return total;
}

}  // namespace

StageUtilisation stage_utilisation(const std::vector<Span>& spans, int stages, int64_t step) {
  if (stages < 1) {
    throw Error("stage_utilisation: stages must be >= 1, got " + std::to_string(stages),
                ErrorKind::Usage);
  }
  StageUtilisation u;
  u.busy_us.assign(static_cast<size_t>(stages), 0.0);
  std::vector<std::vector<std::pair<double, double>>> work(static_cast<size_t>(stages));
  double first = 0, last = 0;
  bool any = false;
  for (const Span& s : spans) {
    if (!is_work(s.phase) || s.ids.stage < 0 || (step >= 0 && s.ids.step != step)) continue;
    if (s.ids.stage >= stages) {
      throw Error(kiln::detail::str("stage_utilisation: span '", s.name, "' belongs to stage ",
                              s.ids.stage, " but the pipeline has ", stages, " stages"),
                  ErrorKind::Usage);
    }
    work[static_cast<size_t>(s.ids.stage)].emplace_back(s.start_us, std::max(s.start_us, s.end_us));
    first = any ? std::min(first, s.start_us) : s.start_us;
    last = any ? std::max(last, s.end_us) : s.end_us;
    any = true;
  }
  if (!any) return u;
  u.window_us = last - first;
  double busy = 0;
  for (int st = 0; st < stages; ++st) {
    u.busy_us[static_cast<size_t>(st)] = union_length(work[static_cast<size_t>(st)]);
    busy += u.busy_us[static_cast<size_t>(st)];
  }
  u.bubble_fraction = u.window_us > 0 ? 1.0 - busy / (stages * u.window_us) : 0.0;
  return u;
}

double theoretical_bubble(int stages, int micro_batches) {
  if (stages < 1 || micro_batches < 1) {
    throw Error(kiln::detail::str("theoretical_bubble: stages and micro_batches must be >= 1, got ",
                            stages, " and ", micro_batches),
                ErrorKind::Usage);
  }
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace kiln::trace
