// trace.h: one tracer for the whole process: timed spans, Chrome trace JSON, pipeline bubbles.
//
//   trace::Tracer::global().enable();
//   { trace::Scope s("forward", trace::Phase::Forward, device, trace::Ids{0, 3});  // stage 0, mb 3
//     ... work ... }                                   // [construction, destruction) is recorded
//   trace::Tracer::global().write_chrome_json("run.json");   // open in ui.perfetto.dev
//
// The tracer knows no layers, stages or optimizers: callers say what a span is (a Phase and the
// Ids it belongs to) and the tracer keeps time. Disabled (the default) a Scope costs one atomic
// load, so spans can stay in the hot path of every run.
//
// Time. Host spans read the steady clock. A span on a CUDA device is timed by the GPU: two
// timing events on the recording thread's current stream, so it measures when the device ran
// the work queued inside the scope, not when the host queued it. GPU times are put on the host
// clock through one anchor event per device (recorded and synchronised, then read against the
// host clock, when the first span of that device begins), so host and device spans share one
// time line. The events are read only in spans() and write_chrome_json().
//
// stage_utilisation() turns the spans of a pipeline step into per-stage busy time and the
// bubble fraction, the share of stage-time spent idle.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/device.h"

namespace kiln::trace {

enum class Phase : uint8_t {
  Forward, Backward, Recompute, Send, Receive, Optimizer, LoaderWait, HostToDevice, Allreduce, Other,
  // The weight-gradient half of a split backward (zero-bubble pipelines: models/pipeline/schedule.h);
  // Backward is then the input-gradient half.
  Weight
};
// "forward", "backward", "recompute", "send", "receive", "optimizer", "loader_wait", "h2d",
// "allreduce", "other", "weight"
const char* phase_name(Phase p);

struct Ids {  // what a span belongs to; -1 = not applicable
  int stage = -1;
  int micro_batch = -1;
  int bucket = -1;
  int64_t step = -1;
  int replica = -1;  // data-parallel replica (hybrid runs)
  int chunk = -1;    // the device's model chunk (interleaved pipelines)
};

struct Span {
  std::string name;  // e.g. "forward", "bucket 3"
  Phase phase = Phase::Other;
  double start_us = 0;  // microseconds since the tracer's epoch (steady clock)
  double end_us = 0;
  Ids ids;
  std::string device;  // "cpu:0", "cuda:1"
  int thread = 0;      // small id of the recording thread (0, 1, 2... in order of first use)
};

namespace detail {
struct OpenSpan;       // a span being recorded, or one whose times are still GPU events
struct DeviceAnchors;  // per device: the event that maps GPU time to the host clock
}  // namespace detail

class Tracer {
 public:
  Tracer();
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  static Tracer& global();      // the process's tracer, disabled until enable()
  void enable(bool on = true);  // enabling sets the epoch to now if no span was recorded yet
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void clear();          // drops all spans (and pending CUDA spans), new epoch
  double now_us() const;  // microseconds since the epoch
  void add(Span span);    // thread-safe
  // Resolved spans sorted by start (CUDA spans turned into times, see Scope), thread-safe.
  std::vector<Span> spans() const;
  // Chrome trace event format ("X" complete events; process = device, thread rows named by
  // the thread's label (set_thread_label: "rank 0", "rank 1 loader worker 0"), else "stage S"
  // when the thread recorded stage spans, else "thread N"; args carry the Ids and
  // phase). Opens in https://ui.perfetto.dev and chrome://tracing. Written atomically by
  // write_output_file (engine/output_file.h): a failed write throws kiln::Error (Runtime)
  // naming `what` (the flag that chose the path, "--trace"), the path and the system's reason,
  // and leaves a previous file at `path` as it was.
  void write_chrome_json(const std::string& path, const std::string& what = "the trace") const;

 private:
  friend class Scope;
  // Scope's CUDA side: records and synchronises `device`'s anchor event, and notes the host
  // time it completed at, unless the device has one since the last clear().
  void ensure_anchor(int device);
  void add_open(std::unique_ptr<detail::OpenSpan> span);  // a Scope's span, once it ended
  uint64_t generation() const;  // bumped by a new epoch: a scope open across it is dropped
  void resolve_pending_locked() const;

  std::atomic<bool> enabled_{false};
  std::atomic<int64_t> epoch_ns_{0};  // steady-clock time of the epoch
  mutable std::mutex mu_;
  uint64_t generation_ = 0;
  // Resolving a pending CUDA span reads its events and moves it to spans_: the spans recorded
  // stay the same, so spans() is const.
  mutable std::vector<Span> spans_;
  mutable std::vector<std::unique_ptr<detail::OpenSpan>> pending_;
  std::unique_ptr<detail::DeviceAnchors> anchors_;
};

// Names the calling thread's rows in the Chrome trace: "rank 1" for a data-parallel rank,
// "rank 1 loader worker 0" for a thread it started. Call it once, as the thread starts (before
// or after the tracer is enabled); a thread without a label keeps "stage S" / "thread N".
void set_thread_label(const std::string& label);
// The calling thread's label ("" when it has none): what a thread it starts extends.
std::string thread_label();

// RAII span: records [construction, destruction) into Tracer::global() if it is enabled when
// constructed; costs one atomic load when disabled. On a CUDA device (device.is_cuda()) it
// records timing events on the calling thread's current stream at begin and end, and the span's
// times are the GPU's (mapped to the host clock through an anchor event per device recorded and
// synchronised when the first CUDA span of that device is seen); resolution happens in spans()
// / write_chrome_json(), which synchronise those events. Without CUDA support compiled in, CUDA
// spans use host times.
class Scope {
 public:
  Scope(std::string name, Phase phase, Device device = Device(), Ids ids = {});
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::unique_ptr<detail::OpenSpan> open_;  // the span being recorded; null when not tracing
};

// Busy-time analysis of a pipeline step. Work = Forward, Backward and Recompute spans with
// ids.stage >= 0. The window runs from the earliest start to the latest end of those spans
// (optionally only those with ids.step == step when step >= 0). For each stage, busy = the
// length of the union of its work spans inside the window. bubble_fraction = 1 - sum(busy) /
// (stages * window). (GPipe's theoretical bubble is (p - 1) / (m + p - 1).)
// Throws kiln::Error for stages < 1 or a work span of a stage >= stages.
struct StageUtilisation {
  double window_us = 0;
  std::vector<double> busy_us;  // per stage, index = stage
  double bubble_fraction = 0;   // 0 when there is no work span (an empty window)
};
StageUtilisation stage_utilisation(const std::vector<Span>& spans, int stages, int64_t step = -1);
double theoretical_bubble(int stages, int micro_batches);  // (p - 1) / (m + p - 1)

}  // namespace kiln::trace
