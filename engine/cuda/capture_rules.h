// capture_rules.h: what each stream-capture error of the CUDA runtime means, and what to do.
//
// While a stream captures work into a CUDA graph (cuda::Graph, graph.h), CUDA refuses the calls
// a graph cannot record and invalidates the capture. The runtime's own text ("operation not
// permitted when stream is capturing") does not say which rule was broken in Kiln's terms, so
// KILN_CUDA_CHECK (check.h) appends this advice to every capture error. The rules: the CUDA C++
// Programming Guide, "CUDA Graphs", sections "Stream Capture", "Cross-stream Dependencies and
// Events", "Prohibited and Unhandled Operations" and "Invalidation"
// (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#cuda-graphs), and the CUDA Runtime
// API's cudaStreamBeginCapture and cudaThreadExchangeStreamCaptureMode
// (https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__STREAM.html).
#pragma once

#include "engine/cuda/runtime.h"

namespace kiln::cuda {

// The rule behind a capture error and the fix, or null for any other error.
inline const char* capture_rule_advice(cudaError_t err) {
  switch (err) {
    case cudaErrorStreamCaptureUnsupported:
      return "a call a CUDA graph capture forbids was made inside the captured region: a host "
             "wait (cuda::synchronize(), Event::synchronize(), item(), to_vector(), a copy to or "
             "from pageable host memory), or an allocation or free the graph cannot record "
             "(cudaMalloc, cudaFree or cudaHostAlloc outside Kiln's caching allocator: a "
             "library's lazily allocated workspace, a first pin_memory()). Move it out of the "
             "captured region (before capture_begin() or after capture_end()), and run the step "
             "once before capturing so that lazy allocations are made eagerly";
    case cudaErrorStreamCaptureInvalidated:
      return "an earlier call in the captured region broke a capture rule and invalidated the "
             "capture, so nothing was recorded; that call failed with an error of its own that "
             "names the rule: fix it and capture again";
    case cudaErrorStreamCaptureMerge:
      return "a stream of one capture waited for an event recorded in another capture: two "
             "captures cannot merge into one graph; keep each capture's streams apart";
    case cudaErrorStreamCaptureUnmatched:
      return "the capture was ended on another stream than the one it began on: end it on the "
             "stream that began it";
    case cudaErrorStreamCaptureUnjoined:
      return "a stream forked from the capture (it waited for an event recorded in the capture) "
             "was not joined back: record an event on that stream and make the capturing stream "
             "wait for it before the capture ends";
    case cudaErrorStreamCaptureIsolation:
      return "a capturing stream waited for an event recorded outside the capture: a graph "
             "cannot depend on work that runs eagerly; make that stream wait before the capture "
             "begins, or record the event inside the capture";
    case cudaErrorStreamCaptureImplicit:
      return "the legacy default stream (stream 0) was used while a blocking stream of the "
             "device captures: it would synchronise with the capture implicitly; queue work on "
             "Kiln's streams (cuda::current_stream(), created non-blocking), never on stream 0";
    case cudaErrorCapturedEvent:
      return "an event recorded inside the capture was queried or waited for by the host: it "
             "marks a point of the graph, not of any run of it; record an event after "
             "Graph::replay() and wait for that instead";
    case cudaErrorStreamCaptureWrongThread:
      return "the capture was ended by another host thread than the one that began it (only a "
             "relaxed capture allows that): end it on the thread that began it";
    default:
      return nullptr;
  }
}

}  // namespace kiln::cuda
