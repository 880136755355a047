// dnnl_cpu.h: what every oneDNN (libdnnl) call of Kiln shares: the CPU engine, this thread's
// stream, the dtype mapping, and the test for oneDNN's slow reference implementations.
// Internal: the engine's low-precision GEMM (engine/gemm_lowp_cpu.cpp) and the layers' vendor
// convolutions (layers/conv2d_dnnl*.cpp) include it; nothing in Kiln's public API exposes oneDNN.
//
// Threads. Debian's libdnnl uses OpenMP and runs on the calling thread's OpenMP budget
// (kiln::set_num_threads). The stream is thread_local, so threads never share one.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <string>

#include "engine/dtype.h"

namespace kiln::dnnl_cpu {

dnnl::engine& engine();  // the one CPU engine (oneDNN's engine index 0)
dnnl::stream& stream();  // this thread's stream on it

// oneDNN's data type of F32, F16 or BF16 (anything else is a kiln::Error).
dnnl::memory::data_type data_type(DType t);

// True when oneDNN chose its reference implementation ("ref:any", "ref_...") for a primitive:
// plain C++ loops, correct but orders of magnitude slower than the JIT kernels. Callers with
// a faster fallback of their own take it instead.
bool is_reference(const std::string& impl_info);

}  // namespace kiln::dnnl_cpu
