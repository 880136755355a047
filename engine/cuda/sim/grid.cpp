// sim/grid.cpp: a kernel launch = check the configuration, then run every block of the grid.
//
// Blocks are independent (a GPU runs them in any order, many at once), so they are handed out
// to a small pool of OS threads through one atomic counter; the launching thread takes blocks
// too and returns when all are done. That launching thread is the stream's worker (streams.cpp):
// run_kernel validates the launch on the host thread, then queues the grid. Pool size:
// env KILN_SIM_THREADS, default the number of hardware threads; a small grid runs on the
// launching thread alone (waking the pool costs more than it saves).
//
// Models the Programming Guide's "Thread Hierarchy" (a grid of independent blocks) and
// "Execution Configuration" (the launch limits):
// https://docs.nvidia.com/cuda/cuda-c-programming-guide/
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda/sim/internal.h"
#include "engine/cuda/sim/scheduler.h"
#include "engine/error.h"

namespace kiln::sim {

namespace {

constexpr size_t kDefaultSharedLimit = 48 * 1024;   // per block, without opt-in
constexpr size_t kOptinSharedLimit = 227 * 1024;    // H100: the most a kernel can opt in to
constexpr uint64_t kMinParallelThreads = 8192;       // smaller grids run on the caller alone

std::mutex g_attr_mutex;
std::map<const void*, size_t> g_dynamic_shared_limit;  // per kernel, set by cudaFuncSetAttribute

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}
std::atomic<bool> g_shuffle{env_flag("KILN_SIM_SHUFFLE") || env_flag("KILN_SIM_SHUFFLE_SEED")};
std::atomic<uint64_t> g_shuffle_seed{env_size("KILN_SIM_SHUFFLE_SEED", 1)};
std::atomic<uint64_t> g_launches{0};

uint64_t mix(uint64_t a, uint64_t b) {  // combines seeds (a splitmix64 step)
  uint64_t z = a * 0x9e3779b97f4a7c15ull + b + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z != 0 ? z : 1;  // 0 means "no shuffle"
}

std::string dims(dim3 d) {
  return std::to_string(d.x) + "x" + std::to_string(d.y) + "x" + std::to_string(d.z);
}

[[noreturn]] void launch_error(const KernelLaunch& l, const std::string& why) {
  throw Error("CUDA kernel launch failed (simulator): " + why + " (grid " + dims(l.grid) +
              ", block " + dims(l.block) + ", " + std::to_string(l.shared_bytes) +
              " B dynamic shared memory)");
}

// The checks a GPU makes at launch (cudaErrorInvalidConfiguration & co), as kiln::Error.
void validate(const KernelLaunch& l) {
  if (inside_kernel()) launch_error(l, "a kernel launched a kernel (dynamic parallelism is not supported)");
  if (configured_device_count() == 0) launch_error(l, "no CUDA device (KILN_SIM_DEVICES=0)");
  const int device = current_device();
  int stream_dev = 0;
  if (!stream_device(l.stream, &stream_dev))
    launch_error(l, "invalid stream handle (destroyed, or never created)");
  if (stream_dev != device)
    launch_error(l, "the stream belongs to cuda:" + std::to_string(stream_dev) +
                        " but the current device is cuda:" + std::to_string(device) +
                        " (a missing DeviceGuard?)");
  const uint64_t threads = uint64_t{l.block.x} * l.block.y * l.block.z;
  if (threads == 0) launch_error(l, "invalid configuration argument: a block dimension is 0");
  if (threads > 1024)
    launch_error(l, "invalid configuration argument: " + std::to_string(threads) +
                        " threads per block, the limit is 1024");
  if (l.block.x > 1024 || l.block.y > 1024 || l.block.z > 64)
    launch_error(l, "invalid configuration argument: block dimensions are limited to 1024x1024x64");
  if (l.grid.x == 0 || l.grid.y == 0 || l.grid.z == 0)
    launch_error(l, "invalid configuration argument: a grid dimension is 0");
  if (l.grid.x > 2147483647u || l.grid.y > 65535 || l.grid.z > 65535)
    launch_error(l, "invalid configuration argument: grid dimensions are limited to "
                    "2147483647x65535x65535");
  const size_t limit = shared_memory_limit(l.kernel);
  if (l.shared_bytes > limit)
    launch_error(l, "too much dynamic shared memory: " + std::to_string(l.shared_bytes) +
                        " B, the kernel's limit is " + std::to_string(limit) +
                        " B (above 48 KiB a kernel must opt in with cudaFuncSetAttribute(kernel, "
                        "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), up to 227 KiB)");
}

// One launch being executed: blocks are claimed through `next`.
struct Job {
  const KernelLaunch* launch = nullptr;
  uint64_t total = 0;
  uint64_t seed = 0;  // 0: no shuffle
  std::atomic<uint64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  int helpers = 0;  // pool threads working on it (guarded by the pool's mutex)
};

void work(Job& job) {
  const dim3 g = job.launch->grid;
  for (;;) {
    const uint64_t i = job.next.fetch_add(1);
    if (i >= job.total) return;
    // blockIdx.x varies fastest, as in the GPU's (unspecified but usual) order.
    const uint3 b{static_cast<unsigned>(i % g.x), static_cast<unsigned>(i / g.x % g.y),
                  static_cast<unsigned>(i / (uint64_t{g.x} * g.y))};
    try {
      run_block(*job.launch, b, job.seed ? mix(job.seed, i) : 0);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
      job.next.store(job.total);  // stop handing out blocks
    }
  }
}

// The OS threads that help run blocks. Created on first use and deliberately never destroyed
// (joining threads during static destruction invites order-of-destruction bugs).
class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool();
    return *pool;
  }
  bool has_helpers() const { return !workers_.empty(); }

  void run(Job& job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(&job);
    }
    work_cv_.notify_all();
    work(job);  // the launching thread works too
    std::unique_lock<std::mutex> lock(mutex_);
    remove(&job);
    idle_cv_.wait(lock, [&] { return job.helpers == 0; });  // blocks still running elsewhere
  }

 private:
  Pool() {
    size_t n = env_size("KILN_SIM_THREADS", std::thread::hardware_concurrency());
    n = std::max<size_t>(n, 1);
    for (size_t i = 1; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }
  void remove(Job* job) { jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), job), jobs_.end()); }
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [&] { return !jobs_.empty(); });
      Job* job = jobs_.front();
      if (job->next.load() >= job->total) {  // all its blocks are claimed: drop it
        remove(job);
        continue;
      }
      ++job->helpers;
      lock.unlock();
      work(*job);
      lock.lock();
      remove(job);
      --job->helpers;
      idle_cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<Job*> jobs_;
  std::vector<std::thread> workers_;
};

}  // namespace

size_t shared_memory_limit(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_attr_mutex);
  auto it = g_dynamic_shared_limit.find(kernel);
  return it != g_dynamic_shared_limit.end() ? it->second : kDefaultSharedLimit;
}

namespace {
void run_grid(const KernelLaunch& launch, uint64_t seed) {
  Job job;
  job.launch = &launch;
  job.total = uint64_t{launch.grid.x} * launch.grid.y * launch.grid.z;
  job.seed = seed;
  const uint64_t threads = job.total * launch.block.x * launch.block.y * launch.block.z;
  if (job.total >= 2 && threads >= kMinParallelThreads && Pool::instance().has_helpers()) {
    Pool::instance().run(job);
  } else {
    work(job);
  }
  if (job.error) std::rethrow_exception(job.error);
}
}  // namespace

void run_kernel(const KernelLaunch& launch) {
  validate(launch);
  // The shuffle seed is fixed at submission, so a run is reproducible whatever the timing.
  const uint64_t launch_id = g_launches.fetch_add(1);
  const uint64_t seed = g_shuffle.load() ? mix(g_shuffle_seed.load(), launch_id) : 0;
  const cudaError_t e = enqueue(launch.stream, "kernel", [launch, seed] {
    try {
      run_grid(launch, seed);
    } catch (const std::exception& ex) {
      throw Error("grid " + dims(launch.grid) + ", block " + dims(launch.block) + ": " + ex.what());
    }
  });
  if (e != cudaSuccess) {
    // A fault earlier on this device, or a stream that died since validate().
    const std::string fault = fault_message();
    launch_error(launch, std::string(cudaGetErrorName(e)) +
                             (fault.empty() ? std::string() : " after an earlier fault: " + fault));
  }
}

bool pointer_checks_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("KILN_SIM_CHECK_POINTERS");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

void check_kernel_pointer(const void* p, int index) {
  if (p == nullptr) return;
  const Region r = find_region(p);
  const int device = current_device();
  if (r.kind == MemoryKind::PinnedHost || (r.kind == MemoryKind::Device && r.device == device))
    return;
  char addr[32];
  std::snprintf(addr, sizeof addr, "%p", p);
  std::string why = "kernel argument " + std::to_string(index) + " (" + addr + ") ";
  if (r.kind == MemoryKind::Device)
    why += "points to memory of cuda:" + std::to_string(r.device) + " but the kernel runs on cuda:" +
           std::to_string(device) + " (a tensor on the wrong device, or a missing DeviceGuard?)";
  else
    why += "is not device memory: a host pointer, or a freed buffer";
  throw Error("CUDA kernel launch failed (simulator): " + why +
              " [set KILN_SIM_CHECK_POINTERS=0 to skip this check]");
}

cudaError_t set_function_attribute(const void* kernel, cudaFuncAttribute attr, int value) {
  if (kernel == nullptr) return fail(cudaErrorInvalidValue);
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      if (value < 0 || static_cast<size_t>(value) > kOptinSharedLimit)
        return fail(cudaErrorInvalidValue);
      {
        std::lock_guard<std::mutex> lock(g_attr_mutex);
        g_dynamic_shared_limit[kernel] = static_cast<size_t>(value);
      }
      return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      // A hint about the L1/shared split: meaningful on a GPU only, valid values -1..100.
      return value >= -1 && value <= 100 ? cudaSuccess : fail(cudaErrorInvalidValue);
  }
  return fail(cudaErrorInvalidValue);
}

void set_shuffle(bool enabled, uint64_t seed) {
  g_shuffle_seed.store(seed);
  g_shuffle.store(enabled);
}
bool shuffle_enabled() { return g_shuffle.load(); }

}  // namespace kiln::sim
