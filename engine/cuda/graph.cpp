// graph.cpp: capture into a CUDA graph with a private memory pool, and replay. See graph.h.
#include "engine/cuda/graph.h"

#include <exception>
#include <thread>

#include "engine/cuda/check.h"
#include "engine/cuda/launch_count.h"
#include "engine/cuda/sync_debug.h"
#include "engine/error.h"

namespace kiln::cuda {
namespace {

cudaStreamCaptureMode to_cuda(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::Global: return cudaStreamCaptureModeGlobal;
    case CaptureMode::ThreadLocal: return cudaStreamCaptureModeThreadLocal;
    case CaptureMode::Relaxed: return cudaStreamCaptureModeRelaxed;
  }
  return cudaStreamCaptureModeGlobal;
}

}  // namespace

Graph::~Graph() {
  if (capturing_) abandon_capture();
  if (exec_) (void)cudaGraphExecDestroy(exec_);  // a replay still queued runs to its end
  if (graph_) (void)cudaGraphDestroy(graph_);
  if (pool_) {
    AllowSync allow("a destroyed cuda::Graph returns its memory pool to the driver");
    try {
      cuda_allocator::release_pool(device_, pool_);
    } catch (const std::exception&) {
      // A destructor does not throw. The failure (a faulted device) is reported again by the
      // next CUDA call that checks its result.
    }
  }
  if (stream_) (void)cudaStreamDestroy(stream_);
}

void Graph::capture_begin(CaptureMode mode) {
  KILN_CHECK(!capturing_, "Graph::capture_begin: this Graph is capturing already (call "
             "capture_end() first)");
  KILN_CHECK(exec_ == nullptr, "Graph::capture_begin: this Graph holds a captured graph already; "
             "use a new Graph for another capture");
  const int device = current_device();
  KILN_CHECK(device_ == -1 || device_ == device, "Graph::capture_begin on cuda:", device,
             ": this Graph's stream and pool belong to cuda:", device_);
  device_ = device;
  if (stream_ == nullptr) KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (pool_ == 0) pool_ = cuda_allocator::create_pool();
  // The pool first: from here until the capture has ended, every allocation on the capture
  // stream is the graph's (caching_allocator.h, point 5).
  cuda_allocator::begin_allocate_to_pool(device_, pool_, stream_);
  const cudaError_t err = cudaStreamBeginCapture(stream_, to_cuda(mode));
  if (err != cudaSuccess) {
    cuda_allocator::end_allocate_to_pool(device_, pool_);
    KILN_CUDA_CHECK(err);
  }
  current_.emplace(device_, stream_);
  thread_ = std::this_thread::get_id();
  capturing_ = true;
}

void Graph::capture_end() {
  KILN_CHECK(capturing_, "Graph::capture_end without capture_begin");
  // CUDA refuses to end a capture on another thread (cudaErrorStreamCaptureWrongThread), and
  // the current stream that capture_begin() set is the beginning thread's.
  KILN_CHECK(thread_ == std::this_thread::get_id(),
             "Graph::capture_end on another host thread than capture_begin: end the capture on "
             "the thread that began it");
  current_.reset();
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(stream_, &graph);
  capturing_ = false;
  cuda_allocator::end_allocate_to_pool(device_, pool_);
  if (err != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw_cuda_error(err, "cudaStreamEndCapture (Graph::capture_end)", __FILE__, __LINE__);
  }
  graph_ = graph;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

void Graph::capture(const std::function<void()>& work, CaptureMode mode) {
  capture_begin(mode);
  try {
    work();
  } catch (...) {
    abandon_capture();
    throw;
  }
  capture_end();
}

void Graph::replay() {
  KILN_CHECK(exec_ != nullptr, "Graph::replay: nothing captured yet (capture(work), or "
             "capture_begin() ... capture_end())");
  DeviceGuard guard(device_);
  KILN_CUDA_CHECK(cudaGraphLaunch(exec_, current_stream(device_)));
  count_launch();  // the whole graph: one launch for the host (launch_count.h)
}

void Graph::abandon_capture() {
  current_.reset();
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr)
    (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();  // an invalidated capture's error is the work's to report
  capturing_ = false;
  cuda_allocator::end_allocate_to_pool(device_, pool_);
}

}  // namespace kiln::cuda
