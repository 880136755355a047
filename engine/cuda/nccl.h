// nccl.h: the one NCCL header Kiln includes: the real <nccl.h>, or under the simulator
// (-DKILN_CUDA_SIM=ON) its stand-in engine/cuda/sim/nccl.h (docs/cuda_simulator.md, "NCCL").
#pragma once

#include "engine/cuda/runtime.h"

#if KILN_CUDA_SIM
#include "engine/cuda/sim/nccl.h"
#else
#include <nccl.h>
#endif
