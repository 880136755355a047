// context.cpp: device discovery, the device guard, per-thread streams, events. See context.h.
#include "engine/cuda/context.h"

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/sync_calls.h"
#include "engine/error.h"

namespace kiln::cuda {

// ---- Devices --------------------------------------------------------------------------------

namespace {

struct Discovery {
  int count = 0;
  std::string reason;  // why count is 0
};

// Asks the runtime once. Errors that mean "no usable GPU here" become count 0 with a reason:
// this must never throw, because `--device auto` and every test's skip check call it.
Discovery discover() {
  Discovery d;
  const cudaError_t err = cudaGetDeviceCount(&d.count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls do not report it again
    d.count = 0;
    const std::string what = std::string(" (cudaGetDeviceCount: ") + cudaGetErrorName(err) + ")";
    if (err == cudaErrorNoDevice) {
      d.reason = "the driver reports no CUDA-capable GPU" + what;
    } else if (err == cudaErrorInsufficientDriver) {
      d.reason = "the NVIDIA driver is missing or older than this CUDA runtime" + what;
    } else {
      d.reason = std::string("the CUDA runtime failed to start: ") + cudaGetErrorString(err) + what;
    }
  } else if (d.count == 0) {
    d.reason = "the CUDA runtime found 0 devices";
  }
#if KILN_CUDA_SIM
  if (d.count == 0) d.reason = "the CUDA simulator was started with KILN_SIM_DEVICES=0";
#endif
  return d;
}

const Discovery& discovery() {
  static const Discovery d = discover();  // thread-safe initialisation (C++11)
  return d;
}

}  // namespace

int device_count() { return discovery().count; }
bool is_available() { return device_count() > 0; }

std::string unavailable_reason() {
  if (is_available()) return "";
  return "no CUDA device: " + discovery().reason + "; use --device cpu";
}

void check_device(int index) {
  const int n = device_count();
  if (index >= 0 && index < n) return;
  const std::string name = "device cuda:" + std::to_string(index) + " is not available: ";
  if (n == 0) throw Error(name + unavailable_reason(), ErrorKind::Usage);
  const std::string have = n == 1 ? "1 CUDA device (cuda:0)"
                                  : std::to_string(n) + " CUDA devices (cuda:0..cuda:" +
                                        std::to_string(n - 1) + ")";
  throw Error(name + "this machine has " + have + "; pick one of those, or use --device cpu",
              ErrorKind::Usage);
}

int current_device() {
  int d = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

DeviceGuard::DeviceGuard(int index) : index_(index) {
  check_device(index);
  previous_ = current_device();
  if (index_ != previous_) KILN_CUDA_CHECK(cudaSetDevice(index_));
}

DeviceGuard::~DeviceGuard() {
  if (index_ != previous_) (void)cudaSetDevice(previous_);  // destructors do not throw
}

// ---- Streams --------------------------------------------------------------------------------

namespace {

// This thread's streams, one slot per device. When the thread ends, each stream is drained and
// destroyed. Draining matters: the caching allocator keys its free lists by stream handle, and a
// later stream may get the same handle; with the old stream's work finished, reusing its cached
// blocks is safe.
struct ThreadStreams {
  std::vector<cudaStream_t> by_device;
  std::vector<cudaStream_t> guarded;  // per device: the innermost StreamGuard's stream, or null
  ~ThreadStreams() {
    AllowSync allow("a thread's streams are drained when it ends");
    for (size_t d = 0; d < by_device.size(); ++d) {
      if (!by_device[d]) continue;
      (void)cudaSetDevice(static_cast<int>(d));
      (void)stream_synchronize_nothrow(by_device[d]);
      (void)cudaStreamDestroy(by_device[d]);
    }
  }
};

thread_local ThreadStreams thread_streams;

}  // namespace

cudaStream_t current_stream(int device) {
  check_device(device);
  const std::vector<cudaStream_t>& guarded = thread_streams.guarded;
  if (static_cast<size_t>(device) < guarded.size() && guarded[static_cast<size_t>(device)])
    return guarded[static_cast<size_t>(device)];
  std::vector<cudaStream_t>& streams = thread_streams.by_device;
  if (streams.size() <= static_cast<size_t>(device)) streams.resize(device_count(), nullptr);
  cudaStream_t& s = streams[static_cast<size_t>(device)];
  if (!s) {
    DeviceGuard guard(device);  // a stream belongs to the device current at its creation
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  return s;
}

cudaStream_t current_stream() { return current_stream(current_device()); }

StreamGuard::StreamGuard(int device, cudaStream_t stream) : device_(device) {
  check_device(device);
  std::vector<cudaStream_t>& guarded = thread_streams.guarded;
  if (guarded.size() <= static_cast<size_t>(device)) guarded.resize(device_count(), nullptr);
  previous_ = std::exchange(guarded[static_cast<size_t>(device)], stream);
}

StreamGuard::~StreamGuard() { thread_streams.guarded[static_cast<size_t>(device_)] = previous_; }

void synchronize(SyncSite site) {
  stream_synchronize(current_stream(), site.named("cuda::synchronize()"));
}

// ---- Events ---------------------------------------------------------------------------------

Event::~Event() {
  // Destroying an event whose recorded work is still pending is allowed: the runtime releases
  // it once the work completes.
  if (event_) (void)cudaEventDestroy(event_);
}

Event::Event(Event&& other) noexcept
    : timing_(other.timing_),
      event_(std::exchange(other.event_, nullptr)),
      device_(std::exchange(other.device_, -1)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_) (void)cudaEventDestroy(event_);
    timing_ = other.timing_;
    event_ = std::exchange(other.event_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

void Event::record(cudaStream_t stream) {
  const int device = current_device();
  if (!event_) {
    const unsigned flags = timing_ == EventTiming::On ? cudaEventDefault : cudaEventDisableTiming;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags));
    device_ = device;
  }
  KILN_CHECK(device == device_, "Event created on cuda:", device_,
             " recorded while cuda:", device,
             " is current: record an event only on streams of the device it was created on");
  KILN_CUDA_CHECK(cudaEventRecord(event_, stream));
}

void Event::wait(cudaStream_t stream) const {
  if (event_) KILN_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

void Event::synchronize(SyncSite site) const {
  if (event_) event_synchronize(event_, site.named("cuda::Event::synchronize()"));
}

bool Event::query() const {
  if (!event_) return true;
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  KILN_CUDA_CHECK(err);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  KILN_CHECK(timing_ == EventTiming::On && end.timing_ == EventTiming::On,
             "Event::elapsed_ms needs two events created with EventTiming::On");
  KILN_CHECK(recorded() && end.recorded(), "Event::elapsed_ms: record both events first");
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

}  // namespace kiln::cuda
