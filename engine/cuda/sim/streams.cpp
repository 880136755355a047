// sim/streams.cpp: streams and events of the simulated CUDA runtime, asynchronous as on a GPU.
// Models the CUDA Runtime API's "Stream Management" and "Event Management" sections
// (https://docs.nvidia.com/cuda/cuda-runtime-api/) and the Programming Guide's "Asynchronous
// Concurrent Execution" (https://docs.nvidia.com/cuda/cuda-c-programming-guide/).
//
// Every stream is a FIFO queue served by its own worker thread (started on first use). Kernel
// launches, async copies and memsets, event records, waits and the host-computed work of the
// vendor stand-ins are queued with enqueue() and return at once; the worker runs them in order,
// each after the operations it depends on. Only what CUDA orders is ordered:
//   - stream order: an operation runs after the one queued before it on the same stream;
//   - cudaStreamWaitEvent: later work on the stream waits for the event's last record;
//   - the legacy default stream (nullptr): its work waits for all work queued before on the
//     device's blocking streams, and a blocking stream's work waits for the legacy stream's
//     (streams created with cudaStreamNonBlocking take part in neither rule);
//   - the implicit synchronisations of the CUDA C++ Programming Guide ("Implicit
//     Synchronization"): work issued after a device or page-locked host allocation, a device
//     memset or a copy between two addresses of the same device's memory starts only once all
//     work issued to the device before it has completed, on every stream of the device,
//     non-blocking streams included (implicit_synchronization(): a *fence*);
//   - the host waits only in cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize
//     and the calls documented as synchronous (cudaMemcpy, copies to pageable memory, cudaFree).
// While a stream captures (cudaStreamBeginCapture), its work is recorded into a graph instead of
// queued: enqueue(), the event calls and the synchronising calls ask graphs.cpp first.
// So a missing cross-stream wait lets work overtake the work it needed, as it would on a GPU,
// and code that needs two streams to overlap across an allocation waits, as it may on a GPU.
//
// Host functions (cudaLaunchHostFunc) keep the runtime's contract and no more: the host
// functions of all streams run one at a time ("may be serialized"), in whatever order their
// streams reach them, and a host function that waits for something which in turn waits for the
// device is a deadlock on a GPU. The simulator reports it instead of hanging: when the host has
// waited in a synchronising call for KILN_SIM_HOST_FN_LIMIT_S seconds (default 20) while one
// host function has been running all that time, it prints what it saw and aborts.
// KILN_SIM_DELAY_US=n sleeps a pseudo-random 0..n microseconds before each operation to widen
// such windows; KILN_SIM_SYNC=1 makes the host wait for every operation (easy to debug).
//
// A device fault (a kernel that throws, barrier divergence, a bad access the simulator detects)
// becomes the device's *sticky error*, as on a GPU: later work on the device is skipped, and
// every synchronising call returns cudaErrorLaunchFailure until cudaDeviceReset; the fault's
// text is kiln::sim::fault_message().
//
// Semantics: CUDA Runtime API, "API synchronization behavior" and "Stream synchronization
// behavior" (https://docs.nvidia.com/cuda/cuda-runtime-api/).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/cuda/sim/internal.h"

namespace kiln::sim {

// The state of one queue. Shared (not owned by the handle) so that an event or a waiting
// operation can still read `completed` after the stream was destroyed.
struct Queue {
  int device = 0;
  bool blocking = true;  // takes part in the legacy default stream's implicit waits
  bool legacy = false;
  uint64_t submitted = 0;  // operations queued so far (g_mutex)
  uint64_t completed = 0;  // operations finished so far (g_mutex)
  uint64_t fence_seen = 0;  // the device's last fence this queue's work already waits for
  struct Op {
    std::function<void()> work;
    const char* what;
    std::vector<Ticket> after;  // runs once each of these has completed
  };
  std::deque<Op> ops;
  bool stopping = false;
  std::thread worker;
};

// Device state: the legacy stream, the sticky error and the fault's text.
struct DeviceState {
  std::shared_ptr<Queue> legacy;
  cudaError_t sticky = cudaSuccess;
  std::string fault;
  // The last implicit synchronisation: every queue's tail when it was issued. The next
  // operation pushed on each queue waits for these (push()).
  std::vector<Ticket> fence;
  uint64_t fence_epoch = 0;
};

namespace {
// One mutex and one condition variable for all queues: a simulator has few streams, and a
// single lock makes "wait until that stream has reached that point" trivially correct. The
// globals are never destroyed: workers may still wait on them while the process exits (and
// destroying a joinable std::thread would terminate it).
std::mutex& g_mutex = *new std::mutex;
std::condition_variable& g_progress = *new std::condition_variable;
std::vector<DeviceState>& g_devices = *new std::vector<DeviceState>;  // g_mutex
std::vector<std::shared_ptr<Queue>>& g_queues = *new std::vector<std::shared_ptr<Queue>>;

bool done(const Ticket& t) { return t.queue == nullptr || t.queue->completed >= t.seq; }

bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}
const bool g_sync_mode = env_on("KILN_SIM_SYNC");
const uint64_t g_delay_us = env_size("KILN_SIM_DELAY_US", 0);

// Host functions: one at a time, whatever their stream (the driver may run them all on one
// thread). g_host_fn_since is the steady_clock time (ns) at which the running one started, 0
// when none runs; g_host_fn_device its stream's device.
std::mutex& g_host_fn_mutex = *new std::mutex;
std::atomic<int64_t> g_host_fn_since{0};
std::atomic<int> g_host_fn_device{-1};
std::atomic<uint64_t> g_host_fn_limit_s{env_size("KILN_SIM_HOST_FN_LIMIT_S", 20)};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

DeviceState& device_state(int device) {  // g_mutex held
  if (g_devices.size() <= static_cast<size_t>(device)) g_devices.resize(static_cast<size_t>(device) + 1);
  return g_devices[static_cast<size_t>(device)];
}

void serve(std::shared_ptr<Queue> q) {  // the worker thread of one queue
  set_current_device(q->device);
  std::minstd_rand delay_rng(static_cast<unsigned>(std::hash<const void*>()(q.get())));
  std::unique_lock<std::mutex> lock(g_mutex);
  for (;;) {
    g_progress.wait(lock, [&] { return !q->ops.empty() || q->stopping; });
    if (q->ops.empty()) return;
    Queue::Op& op = q->ops.front();
    g_progress.wait(lock, [&] {
      return std::all_of(op.after.begin(), op.after.end(), [](const Ticket& t) { return done(t); });
    });
    const bool faulted = device_state(q->device).sticky != cudaSuccess;
    std::function<void()> work = std::move(op.work);
    const char* what = op.what;
    lock.unlock();
    if (g_delay_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_rng() % (g_delay_us + 1)));
    }
    std::string fault;
    if (!faulted && work) {  // after a fault the device runs nothing more, as a GPU context
      try {
        work();
      } catch (const std::exception& e) {
        fault = std::string(what) + ": " + e.what();
      } catch (...) {
        fault = std::string(what) + ": unknown exception";
      }
    }
    work = nullptr;  // release captured resources before reporting completion
    lock.lock();
    if (!fault.empty()) {
      DeviceState& d = device_state(q->device);
      if (d.sticky == cudaSuccess) {
        d.sticky = cudaErrorLaunchFailure;
        d.fault = "cuda:" + std::to_string(q->device) + ": " + fault;
      }
    }
    q->ops.pop_front();
    ++q->completed;
    g_progress.notify_all();
  }
}

// Starts the worker the first time work is queued (g_mutex held).
void ensure_worker(const std::shared_ptr<Queue>& q) {
  if (!q->worker.joinable()) q->worker = std::thread(serve, q);
}

std::shared_ptr<Queue> legacy_queue(int device) {  // g_mutex held
  DeviceState& d = device_state(device);
  if (!d.legacy) {
    d.legacy = std::make_shared<Queue>();
    d.legacy->device = device;
    d.legacy->legacy = true;
    g_queues.push_back(d.legacy);
  }
  return d.legacy;
}

// What the legacy default stream's rules add to an operation queued on q (g_mutex held).
void implicit_waits(const Queue& q, std::vector<Ticket>* after) {
  if (q.legacy) {
    for (const auto& other : g_queues)
      if (other->device == q.device && other->blocking && !other->legacy && other->submitted > 0)
        after->push_back(Ticket{other, other->submitted});
  } else if (q.blocking) {
    const std::shared_ptr<Queue> l = legacy_queue(q.device);
    if (l->submitted > 0) after->push_back(Ticket{l, l->submitted});
  }
}

// The host has waited `waited_ns` in `call`: a host function running for all that time, past
// the limit, is waiting for something that waits for the device (the host thread, or work
// queued behind it): on a GPU that never ends. Report it and abort rather than hang.
void check_host_function_deadlock(const char* call, int64_t waited_ns) {
  const int64_t limit_ns = static_cast<int64_t>(g_host_fn_limit_s.load()) * 1000000000;
  const int64_t since = g_host_fn_since.load();
  if (limit_ns <= 0 || since == 0 || waited_ns < limit_ns || now_ns() - since < limit_ns) return;
  std::fprintf(stderr,
               "kiln CUDA simulator: deadlock: the host has waited %lld s in %s while a host "
               "function (cudaLaunchHostFunc) on cuda:%d has been running all that time. A host "
               "function must not wait for anything that waits for the device: host functions "
               "of all streams may run one at a time, and work queued after it (or after an "
               "allocation, memset or same-device copy) waits for it (CUDA Runtime API, "
               "cudaLaunchHostFunc; CUDA C++ Programming Guide, Implicit Synchronization). "
               "A GPU would hang here. (Limit: KILN_SIM_HOST_FN_LIMIT_S=%llu.)\n",
               static_cast<long long>(waited_ns / 1000000000), call, g_host_fn_device.load(),
               static_cast<unsigned long long>(g_host_fn_limit_s.load()));
  std::fflush(stderr);
  std::abort();
}

// Blocks until every ticket has completed. `call` names the API call that waits (reports).
void wait_for(const std::vector<Ticket>& tickets, const char* call = "a synchronising call") {
  std::unique_lock<std::mutex> lock(g_mutex);
  const auto all_done = [&] {
    return std::all_of(tickets.begin(), tickets.end(), [](const Ticket& t) { return done(t); });
  };
  const int64_t start = now_ns();
  while (!g_progress.wait_for(lock, std::chrono::seconds(1), all_done))
    check_host_function_deadlock(call, now_ns() - start);
}

}  // namespace

}  // namespace kiln::sim

// The handles the API hands out. A stream points at its queue; an event at its last record.
struct CUstream_st {
  std::shared_ptr<kiln::sim::Queue> queue;
  unsigned int flags;
};
struct CUevent_st {
  int device;
  unsigned int flags;
  kiln::sim::Ticket last;  // the point of the stream the last record captured (none: never)
  // Host time at which the last record ran (set by the worker; shared with its operation).
  std::shared_ptr<std::chrono::steady_clock::time_point> time;
};

namespace kiln::sim {
namespace {
std::unordered_set<CUstream_st*>& g_streams = *new std::unordered_set<CUstream_st*>;  // live
std::unordered_set<CUevent_st*>& g_events = *new std::unordered_set<CUevent_st*>;     // handles

// The queue behind a handle, or null for a stranger (g_mutex held).
std::shared_ptr<Queue> queue_of(cudaStream_t stream) {
  if (stream == nullptr) return legacy_queue(current_device());
  return g_streams.count(stream) ? stream->queue : nullptr;
}
bool live_event(cudaEvent_t e) { return g_events.count(e) != 0; }  // g_mutex held

// Queues an operation (g_mutex held). Returns the ticket that says when it has run.
Ticket push(const std::shared_ptr<Queue>& q, const char* what, std::function<void()> work,
            std::vector<Ticket> after) {
  implicit_waits(*q, &after);
  DeviceState& d = device_state(q->device);
  if (q->fence_seen != d.fence_epoch) {  // the first operation since the last fence waits for it
    for (const Ticket& t : d.fence)
      if (!done(t)) after.push_back(t);
    q->fence_seen = d.fence_epoch;
  }
  q->ops.push_back(Queue::Op{std::move(work), what, std::move(after)});
  ++q->submitted;
  ensure_worker(q);
  g_progress.notify_all();
  return Ticket{q, q->submitted};
}

// Every queue of `device` up to what has been submitted so far (g_mutex held).
std::vector<Ticket> device_tails(int device) {
  std::vector<Ticket> tails;
  for (const auto& q : g_queues)
    if (q->device == device && q->submitted > 0) tails.push_back(Ticket{q, q->submitted});
  return tails;
}

cudaError_t sticky(int device) {  // g_mutex held
  return device >= 0 ? device_state(device).sticky : cudaSuccess;
}

cudaError_t check_has_device() {
  return configured_device_count() > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

}  // namespace

cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work,
                    Ticket* ticket, std::vector<Ticket> after) {
  Ticket t;
  bool recorded = false;
  if (const cudaError_t e = capture_work(stream, what, &work, &recorded); e != cudaSuccess)
    return e;
  if (recorded) {  // captured into a graph: nothing runs now
    if (ticket != nullptr) *ticket = Ticket{};
    return cudaSuccess;
  }
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const std::shared_ptr<Queue> q = queue_of(stream);
    if (q == nullptr) return fail(cudaErrorInvalidResourceHandle);
    if (const cudaError_t e = sticky(q->device); e != cudaSuccess) return fail(e);
    t = push(q, what, std::move(work), std::move(after));
  }
  if (ticket != nullptr) *ticket = t;
  if (g_sync_mode) return wait(t);
  return cudaSuccess;
}

cudaError_t fail_if(cudaError_t error) { return error == cudaSuccess ? error : fail(error); }

void implicit_synchronization(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& d = device_state(device);
  d.fence.clear();
  for (Ticket& t : device_tails(device))
    if (!done(t)) d.fence.push_back(std::move(t));
  ++d.fence_epoch;
}

void set_host_function_limit(uint64_t seconds) { g_host_fn_limit_s = seconds; }

cudaError_t wait(const Ticket& ticket) {
  wait_for({ticket}, "a wait for queued work (cudaEventSynchronize, cudaMemcpy)");
  std::lock_guard<std::mutex> lock(g_mutex);
  return ticket.queue ? fail_if(sticky(ticket.queue->device)) : cudaSuccess;
}

cudaError_t synchronize_device(int device) {
  std::vector<Ticket> tails;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    tails = device_tails(device);
  }
  wait_for(tails, "a device-wide synchronisation (cudaDeviceSynchronize, cudaFree, cudaFreeHost)");
  std::lock_guard<std::mutex> lock(g_mutex);
  return fail_if(sticky(device));
}

cudaError_t synchronize_all_devices() {
  cudaError_t first = cudaSuccess;
  for (int d = 0; d < configured_device_count(); ++d) {
    const cudaError_t e = synchronize_device(d);
    if (first == cudaSuccess) first = e;
  }
  return first;
}

bool stream_device(cudaStream_t stream, int* device, bool* blocking) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (stream == nullptr) {
    *device = current_device();
    if (blocking != nullptr) *blocking = true;
    return true;
  }
  if (g_streams.count(stream) == 0) return false;
  *device = stream->queue->device;
  if (blocking != nullptr) *blocking = stream->queue->blocking;
  return true;
}

std::string fault_message() {
  std::lock_guard<std::mutex> lock(g_mutex);
  const int device = current_device();
  return device >= 0 && static_cast<size_t>(device) < g_devices.size()
             ? g_devices[static_cast<size_t>(device)].fault
             : std::string();
}

bool synchronous_streams() { return g_sync_mode; }

}  // namespace kiln::sim

using kiln::sim::fail;
using kiln::sim::g_mutex;

// ---- Device-wide --------------------------------------------------------------------------
cudaError_t cudaDeviceSynchronize() {
  if (kiln::sim::check_has_device() != cudaSuccess) return cudaErrorNoDevice;
  const int device = kiln::sim::current_device();
  if (const cudaError_t e = kiln::sim::check_device_wait(device); e != cudaSuccess) return e;
  return kiln::sim::synchronize_device(device);
}

// Waits for the device's work, then forgets its sticky error (a GPU would destroy the context;
// the simulator's memory and handles stay valid, which is all tests need).
cudaError_t cudaDeviceReset() {
  if (kiln::sim::check_has_device() != cudaSuccess) return cudaErrorNoDevice;
  const int device = kiln::sim::current_device();
  (void)kiln::sim::synchronize_device(device);
  std::lock_guard<std::mutex> lock(kiln::sim::g_mutex);
  kiln::sim::DeviceState& d = kiln::sim::device_state(device);
  d.sticky = cudaSuccess;
  d.fault.clear();
  return cudaSuccess;
}

// ---- Streams ------------------------------------------------------------------------------
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return fail(cudaErrorInvalidValue);
  if (kiln::sim::check_has_device() != cudaSuccess) return cudaErrorNoDevice;
  auto q = std::make_shared<kiln::sim::Queue>();
  q->device = kiln::sim::current_device();
  q->blocking = (flags & cudaStreamNonBlocking) == 0;
  auto* s = new CUstream_st{q, flags};
  std::lock_guard<std::mutex> lock(g_mutex);
  kiln::sim::g_queues.push_back(q);
  kiln::sim::g_streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

// As on a GPU, queued work still runs: the worker drains the queue, then ends.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::shared_ptr<kiln::sim::Queue> q;
  kiln::sim::forget_stream(stream);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (stream == nullptr || kiln::sim::g_streams.erase(stream) == 0)
      return fail(cudaErrorInvalidResourceHandle);
    q = stream->queue;
    delete stream;
    q->stopping = true;
    auto& all = kiln::sim::g_queues;
    all.erase(std::remove(all.begin(), all.end(), q), all.end());
    kiln::sim::g_progress.notify_all();
  }
  if (q->worker.joinable()) q->worker.join();
  return cudaSuccess;
}

// The stream's work so far; for the legacy stream also that of the device's blocking streams
// (which its next operation would wait for).
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::vector<kiln::sim::Ticket> tails;
  int device = 0;
  if (const cudaError_t e = kiln::sim::check_stream_wait(stream); e != cudaSuccess) return e;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto q = kiln::sim::queue_of(stream);
    if (q == nullptr) return fail(cudaErrorInvalidResourceHandle);
    device = q->device;
    tails.push_back(kiln::sim::Ticket{q, q->submitted});
    kiln::sim::implicit_waits(*q, &tails);
  }
  kiln::sim::wait_for(tails, "cudaStreamSynchronize");
  std::lock_guard<std::mutex> lock(g_mutex);
  return kiln::sim::fail_if(kiln::sim::sticky(device));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (const cudaError_t e = kiln::sim::check_stream_wait(stream); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto q = kiln::sim::queue_of(stream);
  if (q == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = kiln::sim::sticky(q->device); e != cudaSuccess) return fail(e);
  // cudaErrorNotReady is a status, not a failure: it does not become the last error.
  return q->completed == q->submitted ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (flags != 0) return fail(cudaErrorInvalidValue);
  bool ever_recorded = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (kiln::sim::queue_of(stream) == nullptr || !kiln::sim::live_event(event))
      return fail(cudaErrorInvalidResourceHandle);
    ever_recorded = event->last.queue != nullptr;
  }
  bool captured = false;  // a fork or join of a capture (graphs.cpp)
  if (const cudaError_t e = kiln::sim::capture_event_wait(stream, event, ever_recorded, &captured);
      e != cudaSuccess || captured)
    return e;
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto q = kiln::sim::queue_of(stream);
  if (q == nullptr || !kiln::sim::live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  if (event->last.queue == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  // The wait captures the event's record as of now; a later record does not move it.
  kiln::sim::push(q, "cudaStreamWaitEvent", nullptr, {event->last});
  return cudaSuccess;
}

// Host functions of all streams run one at a time (the mutex), as the runtime may serialize
// them; the watchdog in wait_for() reads when the running one started.
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  return kiln::sim::enqueue(stream, "cudaLaunchHostFunc", [fn, user_data] {
    std::lock_guard<std::mutex> serial(kiln::sim::g_host_fn_mutex);
    kiln::sim::g_host_fn_device = kiln::sim::current_device();
    kiln::sim::g_host_fn_since = kiln::sim::now_ns();
    struct Done {
      ~Done() { kiln::sim::g_host_fn_since = 0; }
    } done;
    fn(user_data);
  });
}

cudaError_t kiln::sim::enqueue_device_work(cudaStream_t stream, const char* what,
                                           void (*fn)(void*), void* data) {
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  return kiln::sim::enqueue(stream, what, [fn, data] { fn(data); });
}

// ---- Events -------------------------------------------------------------------------------
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0)
    return fail(cudaErrorInvalidValue);
  if (kiln::sim::check_has_device() != cudaSuccess) return cudaErrorNoDevice;
  auto* e = new CUevent_st{kiln::sim::current_device(), flags, {}, nullptr};
  std::lock_guard<std::mutex> lock(g_mutex);
  kiln::sim::g_events.insert(e);
  *event = e;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  kiln::sim::forget_event(event);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (kiln::sim::g_events.erase(event) == 0) return fail(cudaErrorInvalidResourceHandle);
  delete event;  // a pending record still holds its own time slot
  return cudaSuccess;
}

// Queues the record: the event completes when the stream reaches this point. The event and the
// stream must belong to the same device, as on a GPU.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto q = kiln::sim::queue_of(stream);
    if (q == nullptr || !kiln::sim::live_event(event) || event->device != q->device)
      return fail(cudaErrorInvalidResourceHandle);
  }
  bool captured = false;  // recorded into a capture (graphs.cpp): nothing is queued
  if (const cudaError_t e = kiln::sim::capture_event_record(event, stream, &captured);
      e != cudaSuccess || captured)
    return e;
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto q = kiln::sim::queue_of(stream);
  if (q == nullptr || !kiln::sim::live_event(event) || event->device != q->device)
    return fail(cudaErrorInvalidResourceHandle);
  auto time = std::make_shared<std::chrono::steady_clock::time_point>();
  event->time = time;
  event->last = kiln::sim::push(
      q, "cudaEventRecord", [time] { *time = std::chrono::steady_clock::now(); }, {});
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (const cudaError_t e = kiln::sim::check_event_not_captured(event); e != cudaSuccess) return e;
  kiln::sim::Ticket last;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!kiln::sim::live_event(event)) return fail(cudaErrorInvalidResourceHandle);
    last = event->last;
  }
  return kiln::sim::wait(last);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (const cudaError_t e = kiln::sim::check_event_not_captured(event); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!kiln::sim::live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = kiln::sim::sticky(event->device); e != cudaSuccess) return fail(e);
  return kiln::sim::done(event->last) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  for (cudaEvent_t e : {start, end})
    if (const cudaError_t c = kiln::sim::check_event_not_captured(e); c != cudaSuccess) return c;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!kiln::sim::live_event(start) || !kiln::sim::live_event(end))
    return fail(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle);
  if (start->last.queue == nullptr || end->last.queue == nullptr)
    return fail(cudaErrorInvalidResourceHandle);
  if (!kiln::sim::done(start->last) || !kiln::sim::done(end->last)) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(*end->time - *start->time).count();
  return cudaSuccess;
}
