// sim/library_error.h: why the simulated cuBLAS or cuDNN refused this thread's last call.
// The real libraries only return a status; Kiln's error messages under the simulator
// (engine/cuda/blas.cpp, dnn.cpp) append this reason.
// Models nothing of cuBLAS or cuDNN: their calls return only a status
// (https://docs.nvidia.com/cuda/cublas/, https://docs.nvidia.com/deeplearning/cudnn/api/).
#pragma once

namespace kiln::sim {
// "cublasSgemm: lda = 3 < max(1, 4) (rows of A as stored)"; empty after a call that succeeded.
const char* last_library_error();
}  // namespace kiln::sim
