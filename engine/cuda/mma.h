// mma.h: the warp matrix functions (nvcuda::wmma) and the 16-bit float types __half and
// __nv_bfloat16, for kernels that use tensor cores (step 4 of our GEMM,
// engine/cuda/kernels/gemm_tensor_core.cu).
//
// Under nvcc: the toolkit's <mma.h>, <cuda_fp16.h> and <cuda_bf16.h> (bf16 fragments need
// sm_80 or newer). Under the CUDA simulator: engine/cuda/sim/mma.h and sim/fp16.h, the same
// names with a simple model of the fragments (docs/cuda_simulator.md says which).
#pragma once

#include "engine/cuda/runtime.h"

#if KILN_CUDA_SIM
#include "engine/cuda/sim/mma.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif
