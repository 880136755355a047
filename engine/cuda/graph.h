// graph.h: a CUDA graph: the work of a region of code captured once, replayed many times.
//
//   Tensor x = Tensor::zeros({64, 128}, DType::F32, cuda0);  // static input: made before
//   Tensor y;                                                // the capture, refilled later
//   step();                                  // once eagerly first: lazy setup (cuBLAS handles,
//   cuda::Graph g;                           // workspaces) must not happen inside the capture
//   g.capture([&] { y = relu(add(matmul(x, w), b)); });
//   for (...) { x.copy_(next_batch); g.replay(); use(y); }
//
// Why: a training step launches hundreds of small kernels, and each launch costs the host a
// few microseconds; when the kernels are shorter than that, the GPU waits for the host. A graph
// is launched with one call, and the GPU runs its kernels back to back. See the CUDA C++
// Programming Guide, "CUDA Graphs" (https://docs.nvidia.com/cuda/cuda-c-programming-guide/
// #cuda-graphs), and PyTorch's torch.cuda.CUDAGraph, whose design this follows
// (https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs).
//
// What a replay does: exactly the captured kernels and copies, with the arguments they had at
// capture: the same pointers, sizes, scalars. So:
//   - Inputs are "static": the captured work reads the tensors it read during the capture, at
//     their addresses. New data goes INTO them (x.copy_(batch)) before replay(), never a new
//     tensor in their place. Outputs are static too: every replay writes the same y.
//   - No host code runs during a replay: host-side decisions (an `if` on a value, a shape, a
//     random seed drawn on the host) are frozen at their capture-time outcome.
//   - Memory: every block the captured work allocates comes from a private pool of the caching
//     allocator (caching_allocator.h, point 5) and keeps its address for the Graph's life;
//     blocks freed during the capture are reused within it, so the graph needs the memory an
//     eager step needs. The pool goes back to the driver when the Graph is destroyed.
//
// Streams. Kiln's ops queue their work on cuda::current_stream(), which is a thread's own
// stream; CUDA cannot capture the legacy default stream, and a capture takes over its stream
// until it ends. So capture_begin() makes a stream of the Graph's own the current stream (a
// StreamGuard, context.h), and capture_end() gives the previous one back. No event joins the
// two: nothing runs on the capture stream (captured work runs only when the graph is launched,
// in order on the launching stream), and a capturing stream may not wait for work outside the
// capture (cudaErrorStreamCaptureIsolation). replay() launches on the current stream, so a
// replay is ordered after the work queued before it (the copy into x) and before the work
// queued after it (the read of y), as any op is.
//
// The capture rules. While capturing, CUDA refuses what a graph cannot record: host waits
// (item(), to_vector(), cuda::synchronize(), copies to or from pageable memory), cudaMalloc and
// cudaFree outside the caching allocator, the legacy stream. The refused call throws a
// kiln::Error that names the rule and the fix (capture_rules.h); capture(fn) then ends the
// broken capture and rethrows, and the Graph can capture again.
//
// Capture mode. CaptureMode::ThreadLocal (the default) forbids those calls on the capturing
// thread only; Global also on every other thread, which would fail a loader's background
// threads (a pinned-memory allocation, cudaHostAlloc, is such a call); Relaxed forbids nothing
// (cudaStreamBeginCapture in the CUDA Runtime API).
//
// A Graph belongs to one device (the current one at capture_begin()) and, while it captures,
// to the thread that began the capture: capture_end(), or the destructor of a Graph still
// capturing, runs on that thread (the current stream it set is that thread's). Only a build
// with a CUDA backend has this header.
#pragma once

#include <functional>
#include <optional>
#include <thread>

#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/context.h"
#include "engine/cuda/runtime.h"

namespace kiln::cuda {

enum class CaptureMode { Global, ThreadLocal, Relaxed };

class Graph {
 public:
  Graph() = default;
  // Destroys the executable graph and the graph, and releases the private pool (its cudaFree
  // waits for the device, so for any replay still running). A capture still open is abandoned.
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts capturing the work this thread queues on the current device (its current_stream()).
  // Throws kiln::Error when already captured or capturing.
  void capture_begin(CaptureMode mode = CaptureMode::ThreadLocal);
  // Ends the capture and instantiates the graph. A broken capture throws kiln::Error naming the
  // rule (capture_rules.h); the Graph is then as before capture_begin().
  void capture_end();
  // capture_begin(), work(), capture_end(). If work() throws, the capture is abandoned and the
  // exception rethrown.
  void capture(const std::function<void()>& work, CaptureMode mode = CaptureMode::ThreadLocal);
  // Queues the captured work on the current stream of the Graph's device.
  void replay();

  bool captured() const { return exec_ != nullptr; }
  int device() const { return device_; }  // -1 before capture_begin()
  cuda_allocator::PoolId pool() const { return pool_; }

 private:
  void abandon_capture();  // ends an open capture, keeping nothing

  int device_ = -1;
  cudaStream_t stream_ = nullptr;  // the capture stream, the Graph's own
  cuda_allocator::PoolId pool_ = 0;
  std::optional<StreamGuard> current_;  // stream_ as the current stream, while capturing
  std::thread::id thread_;              // the thread that began the capture
  bool capturing_ = false;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace kiln::cuda
