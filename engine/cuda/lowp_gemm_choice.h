// lowp_gemm_choice.h: which of Kiln's GEMM steps cuda::gemm_lowp (engine/ops_cuda.h), the
// matrix product of mixed-precision training, runs on the current device.
#pragma once

namespace kiln::cuda {

enum class LowpGemm {
  Sm90Persistent,  // step 7 (gemm_sm90_ws.cu): compute capability 9.0, unless KILN_GEMM_SM90=0
  TensorCore,      // step 4 (gemm_tensor_core.cu): other devices with bf16/f16 tensor cores
  WidenedF32,      // the inputs widened to f32, then step 3: devices without them
};
LowpGemm lowp_gemm_choice();
const char* lowp_gemm_name(LowpGemm choice);  // "sm90-persistent" | "tensor-core" | "widened-f32"

}  // namespace kiln::cuda
