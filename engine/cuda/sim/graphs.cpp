// sim/graphs.cpp: stream capture and CUDA graphs of the simulated CUDA runtime.
// Models the CUDA Runtime API's "Graph Management" section and the capture calls of "Stream
// Management" (https://docs.nvidia.com/cuda/cuda-runtime-api/), with the rules of the CUDA C++
// Programming Guide, "CUDA Graphs": "Stream Capture", "Cross-stream Dependencies and Events",
// "Prohibited and Unhandled Operations", "Invalidation"
// (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#cuda-graphs).
//
// A *capture* starts on its origin stream (cudaStreamBeginCapture). Work queued on a capturing
// stream goes through enqueue() (streams.cpp) like any work, but is handed here and recorded as
// a *node*: the std::function the call built, with its arguments (kernel parameters, pointers,
// sizes) fixed at capture, as on a GPU. Memory is read when a node runs, so a replay sees the
// current contents of its buffers. Each capturing stream keeps its *tail*: the nodes its next
// node depends on. cudaEventRecord on a capturing stream records the stream's tail in the
// event; cudaStreamWaitEvent on another stream makes that stream join the capture (a fork) or,
// on a stream already in it, adds the event's nodes to its tail (a join). cudaStreamEndCapture
// on the origin ends the capture of every stream that joined; every node must then be an
// ancestor of the origin's tail, or the capture fails with cudaErrorStreamCaptureUnjoined.
//
// Nodes are kept in capture order. A node can only depend on nodes captured before it, so
// capture order is a topological order of the graph: a launch runs the nodes one after
// another, in that order, as one operation on the launch stream's worker. That respects every
// recorded dependency, and the launch as a whole is ordered after the work before it on the
// stream and before the work after it. (A GPU may run independent branches concurrently; a
// program that is correct under any order consistent with the dependencies is correct here.)
//
// The rules a GPU enforces return its errors, and an invalid operation invalidates the captures
// it touches ("Invalidation"): their streams then refuse work with
// cudaErrorStreamCaptureInvalidated until cudaStreamEndCapture, which returns that error and a
// null graph.
#include <algorithm>
#include <cstddef>
#include <exception>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/cuda/sim/internal.h"

namespace kiln::sim {
namespace {

// One recorded operation.
struct Node {
  const char* what;            // "kernel", "cudaMemcpy", "cublasSgemm", ... (fault messages)
  std::function<void()> work;  // as enqueue() received it
  int device;                  // the device of the stream it was captured on
  std::vector<size_t> deps;    // indices of the nodes it runs after
};
using Nodes = std::vector<Node>;

// A stream taking part in a capture.
struct Member {
  int device = 0;
  bool blocking = true;      // not cudaStreamNonBlocking: the legacy stream's rules apply
  std::vector<size_t> tail;  // what the stream's next node depends on
};

// One capture sequence, from cudaStreamBeginCapture to cudaStreamEndCapture.
struct Capture {
  unsigned long long id = 0;
  cudaStream_t origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;  // the thread that began it
  bool invalidated = false;
  std::shared_ptr<Nodes> nodes = std::make_shared<Nodes>();
  std::map<cudaStream_t, Member> members;
};

// An event recorded in a capture: which capture, and the recording stream's tail then.
struct CapturedEvent {
  std::shared_ptr<Capture> capture;
  std::vector<size_t> tail;
};

// Guards everything below. Never held while calling into streams.cpp (whose lock is taken
// first when both are needed: streams.cpp calls in here without holding its own).
std::mutex& g_mutex = *new std::mutex;
std::map<cudaStream_t, std::shared_ptr<Capture>>& g_capturing =
    *new std::map<cudaStream_t, std::shared_ptr<Capture>>;
std::map<cudaEvent_t, CapturedEvent>& g_captured_events = *new std::map<cudaEvent_t, CapturedEvent>;
unsigned long long g_next_id = 1;
thread_local cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;

void invalidate(const std::shared_ptr<Capture>& c) { c->invalidated = true; }

// The open captures with a blocking stream on `device`: what the legacy stream of the device
// would implicitly depend on (g_mutex held).
std::vector<std::shared_ptr<Capture>> blocking_captures(int device) {
  std::vector<std::shared_ptr<Capture>> found;
  for (const auto& [stream, c] : g_capturing) {
    const Member& m = c->members.at(stream);
    if (m.blocking && m.device == device && std::find(found.begin(), found.end(), c) == found.end())
      found.push_back(c);
  }
  return found;
}

// Use of the legacy stream of the current device while a blocking stream of it captures:
// invalidates those captures, cudaErrorStreamCaptureImplicit (g_mutex held).
cudaError_t check_legacy_use() {
  const auto captures = blocking_captures(current_device());
  if (captures.empty()) return cudaSuccess;
  for (const auto& c : captures) invalidate(c);
  return fail(cudaErrorStreamCaptureImplicit);
}

std::shared_ptr<Capture> capture_of(cudaStream_t stream) {  // g_mutex held
  const auto it = g_capturing.find(stream);
  return it == g_capturing.end() ? nullptr : it->second;
}

// The capture an event was last recorded in, if that capture is still open (g_mutex held).
std::shared_ptr<Capture> event_capture(cudaEvent_t event) {
  const auto it = g_captured_events.find(event);
  if (it == g_captured_events.end()) return nullptr;
  return it->second.capture;
}

void add_to_tail(std::vector<size_t>* tail, const std::vector<size_t>& more) {
  for (size_t n : more)
    if (std::find(tail->begin(), tail->end(), n) == tail->end()) tail->push_back(n);
}

// Takes every stream of `c` out of capture and forgets its events (g_mutex held).
void end_capture(const std::shared_ptr<Capture>& c) {
  for (const auto& [stream, member] : c->members) g_capturing.erase(stream);
  for (auto it = g_captured_events.begin(); it != g_captured_events.end();)
    it = it->second.capture == c ? g_captured_events.erase(it) : std::next(it);
}

// Whether every node is an ancestor of (or in) the origin's tail: every fork was joined.
bool all_joined(const Capture& c) {
  const Nodes& nodes = *c.nodes;
  std::vector<bool> reached(nodes.size(), false);
  std::vector<size_t> todo = c.members.at(c.origin).tail;
  while (!todo.empty()) {
    const size_t n = todo.back();
    todo.pop_back();
    if (reached[n]) continue;
    reached[n] = true;
    for (size_t d : nodes[n].deps) todo.push_back(d);
  }
  return std::all_of(reached.begin(), reached.end(), [](bool r) { return r; });
}

// Runs the nodes of a graph in capture order (a topological order), each with its device
// current. A node's fault names the node: "cudaGraphLaunch: kernel: ...".
void run_nodes(const Nodes& nodes) {
  const int home = current_device();
  for (const Node& n : nodes) {
    set_current_device(n.device);
    try {
      n.work();
    } catch (const std::exception& e) {
      set_current_device(home);
      throw std::runtime_error(std::string(n.what) + ": " + e.what());
    }
  }
  set_current_device(home);
}

}  // namespace

// ---- The hooks of streams.cpp and memory.cpp (internal.h) ------------------------------------
cudaError_t capture_work(cudaStream_t stream, const char* what, std::function<void()>* work,
                         bool* recorded) {
  *recorded = false;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (stream == nullptr) return check_legacy_use();
  const std::shared_ptr<Capture> c = capture_of(stream);
  if (c == nullptr) return cudaSuccess;
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  Member& m = c->members.at(stream);
  c->nodes->push_back(Node{what, std::move(*work), m.device, m.tail});
  m.tail = {c->nodes->size() - 1};
  *recorded = true;
  return cudaSuccess;
}

cudaError_t capture_event_record(cudaEvent_t event, cudaStream_t stream, bool* recorded) {
  *recorded = false;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (stream == nullptr) {
    if (const cudaError_t e = check_legacy_use(); e != cudaSuccess) return e;
  }
  const std::shared_ptr<Capture> c = capture_of(stream);
  if (c == nullptr) {
    g_captured_events.erase(event);  // recorded outside any capture from now on
    return cudaSuccess;
  }
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  g_captured_events[event] = CapturedEvent{c, c->members.at(stream).tail};
  *recorded = true;
  return cudaSuccess;
}

cudaError_t capture_event_wait(cudaStream_t stream, cudaEvent_t event, bool ever_recorded,
                               bool* handled) {
  *handled = false;
  int device = 0;
  bool blocking = true;
  if (stream != nullptr && !stream_device(stream, &device, &blocking))
    return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (stream == nullptr) {
    if (const cudaError_t e = check_legacy_use(); e != cudaSuccess) return e;
  }
  const std::shared_ptr<Capture> from = event_capture(event);  // the event's capture
  const std::shared_ptr<Capture> into = capture_of(stream);    // the waiting stream's
  if (from == nullptr && into == nullptr) return cudaSuccess;  // an ordinary wait
  *handled = true;
  if (from == nullptr) {
    // A capturing stream waiting for work that was queued for execution, not captured.
    if (!ever_recorded) return cudaSuccess;  // nothing to wait for, captured or not
    invalidate(into);
    return fail(cudaErrorStreamCaptureIsolation);
  }
  if (into != nullptr && into != from) {  // would merge two captures into one graph
    invalidate(into);
    invalidate(from);
    return fail(cudaErrorStreamCaptureMerge);
  }
  if (from->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (stream == nullptr) {  // the legacy stream cannot capture
    invalidate(from);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  const std::vector<size_t>& tail = g_captured_events.at(event).tail;
  if (into == nullptr) {  // a fork: the stream joins the capture behind the event's nodes
    from->members[stream] = Member{device, blocking, tail};
    g_capturing[stream] = from;
  } else {  // a join: the stream's next node also depends on the event's nodes
    add_to_tail(&from->members.at(stream).tail, tail);
  }
  return cudaSuccess;
}

cudaError_t check_event_not_captured(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::shared_ptr<Capture> c = event_capture(event);
  if (c == nullptr) return cudaSuccess;
  invalidate(c);
  return fail(cudaErrorCapturedEvent);
}

void forget_event(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_captured_events.erase(event);
}

void forget_stream(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::shared_ptr<Capture> c = capture_of(stream);
  if (c == nullptr) return;
  invalidate(c);
  if (c->origin == stream) {
    end_capture(c);  // nothing can end it any more
  } else {
    c->members.erase(stream);
    g_capturing.erase(stream);
  }
}

cudaError_t check_stream_wait(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (stream == nullptr) return check_legacy_use();
  const std::shared_ptr<Capture> c = capture_of(stream);
  if (c == nullptr) return cudaSuccess;
  invalidate(c);
  return fail(cudaErrorStreamCaptureUnsupported);
}

cudaError_t check_device_wait(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  bool any = false;
  for (const auto& [stream, c] : g_capturing) {
    if (c->members.at(stream).device != device) continue;
    invalidate(c);
    any = true;
  }
  return any ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

// cudaThreadExchangeStreamCaptureMode: under the calling thread's mode Global, a capture of this
// thread not begun Relaxed, or a capture of another thread begun Global, forbids the call;
// under ThreadLocal only the former; under Relaxed nothing. The captures that forbid it are
// invalidated.
cudaError_t check_unsafe_call() {
  if (t_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::thread::id self = std::this_thread::get_id();
  bool forbidden = false;
  for (const auto& [stream, c] : g_capturing) {
    const bool mine = c->thread == self && c->mode != cudaStreamCaptureModeRelaxed;
    const bool global = t_mode == cudaStreamCaptureModeGlobal && c->thread != self &&
                        c->mode == cudaStreamCaptureModeGlobal;
    if (!mine && !global) continue;
    invalidate(c);
    forbidden = true;
  }
  return forbidden ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

bool capturing(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_capturing.count(stream) != 0;
}

void invalidate_capture(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (const std::shared_ptr<Capture> c = capture_of(stream)) invalidate(c);
}

}  // namespace kiln::sim

// The handles. A graph and its instantiations share the (immutable) nodes, so either may be
// destroyed first, and a queued launch keeps them alive after cudaGraphExecDestroy.
struct CUgraph_st {
  std::shared_ptr<const kiln::sim::Nodes> nodes;
};
struct CUgraphExec_st {
  std::shared_ptr<const kiln::sim::Nodes> nodes;
  std::mutex launching;     // orders launches from several host threads
  kiln::sim::Ticket last;   // the previous launch: the next one runs after it
};

namespace kiln::sim {
namespace {
std::unordered_set<CUgraph_st*>& g_graphs = *new std::unordered_set<CUgraph_st*>;  // g_mutex
std::unordered_set<CUgraphExec_st*>& g_execs = *new std::unordered_set<CUgraphExec_st*>;
}  // namespace
}  // namespace kiln::sim

using kiln::sim::fail;

// ---- Capture ------------------------------------------------------------------------------
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  // The legacy stream cannot capture: it implicitly depends on every blocking stream.
  if (stream == nullptr) return fail(cudaErrorStreamCaptureUnsupported);
  int device = 0;
  bool blocking = true;
  if (!kiln::sim::stream_device(stream, &device, &blocking))
    return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(kiln::sim::g_mutex);
  if (kiln::sim::g_capturing.count(stream) != 0) return fail(cudaErrorIllegalState);
  auto c = std::make_shared<kiln::sim::Capture>();
  c->id = kiln::sim::g_next_id++;
  c->origin = stream;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->members[stream] = kiln::sim::Member{device, blocking, {}};
  kiln::sim::g_capturing[stream] = c;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(kiln::sim::g_mutex);
  const std::shared_ptr<kiln::sim::Capture> c = kiln::sim::capture_of(stream);
  if (c == nullptr) return fail(cudaErrorIllegalState);
  if (c->origin != stream) return fail(cudaErrorStreamCaptureUnmatched);
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  kiln::sim::end_capture(c);
  *graph = nullptr;
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (!kiln::sim::all_joined(*c)) return fail(cudaErrorStreamCaptureUnjoined);
  auto* g = new CUgraph_st{c->nodes};
  kiln::sim::g_graphs.insert(g);
  *graph = g;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  return cudaStreamGetCaptureInfo(stream, status);
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                     unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** dependencies,
                                     const cudaGraphEdgeData** edge_data,
                                     size_t* num_dependencies) {
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  // The graph under construction and its nodes have no handles in the simulator.
  if (graph != nullptr || dependencies != nullptr || edge_data != nullptr ||
      num_dependencies != nullptr)
    return fail(cudaErrorNotSupported);
  int device = 0;
  if (!kiln::sim::stream_device(stream, &device)) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(kiln::sim::g_mutex);
  if (stream == nullptr) {
    // The query alone does not invalidate the blocking captures it would depend on.
    if (!kiln::sim::blocking_captures(device).empty())
      return fail(cudaErrorStreamCaptureImplicit);
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  const std::shared_ptr<kiln::sim::Capture> c = kiln::sim::capture_of(stream);
  *status = c == nullptr        ? cudaStreamCaptureStatusNone
            : c->invalidated    ? cudaStreamCaptureStatusInvalidated
                                : cudaStreamCaptureStatusActive;
  if (id != nullptr && c != nullptr) *id = c->id;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr || *mode < cudaStreamCaptureModeGlobal ||
      *mode > cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  std::swap(*mode, kiln::sim::t_mode);
  return cudaSuccess;
}

// ---- Graphs -------------------------------------------------------------------------------
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  constexpr unsigned long long kAccepted =
      cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUseNodePriority;
  if (exec == nullptr || (flags & ~kAccepted) != 0) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(kiln::sim::g_mutex);
  if (kiln::sim::g_graphs.count(graph) == 0) return fail(cudaErrorInvalidValue);
  auto* e = new CUgraphExec_st;
  e->nodes = graph->nodes;
  kiln::sim::g_execs.insert(e);
  *exec = e;
  return cudaSuccess;
}

// One operation on `stream` that runs the whole graph: after the work queued on the stream
// before it, before the work queued after it, and after the previous launch of the same exec
// (CUDA orders launches of one graph exec, whatever their streams).
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> lock(kiln::sim::g_mutex);
    if (kiln::sim::g_execs.count(exec) == 0) return fail(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> order(exec->launching);
  const std::shared_ptr<const kiln::sim::Nodes> nodes = exec->nodes;
  kiln::sim::Ticket done;
  std::vector<kiln::sim::Ticket> after;
  if (exec->last.queue != nullptr) after.push_back(exec->last);
  const cudaError_t e = kiln::sim::enqueue(
      stream, "cudaGraphLaunch", [nodes] { kiln::sim::run_nodes(*nodes); }, &done,
      std::move(after));
  if (e != cudaSuccess) return e;
  if (done.queue != nullptr) exec->last = done;  // not when the launch itself was captured
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  std::lock_guard<std::mutex> lock(kiln::sim::g_mutex);
  if (kiln::sim::g_execs.erase(exec) == 0) return fail(cudaErrorInvalidValue);
  delete exec;  // a queued launch holds the nodes itself
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard<std::mutex> lock(kiln::sim::g_mutex);
  if (kiln::sim::g_graphs.erase(graph) == 0) return fail(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}
