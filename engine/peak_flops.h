// peak_flops.h: the peak FLOP/s of a device, per precision (Precision of
// engine/autocast.h): the denominator of MFU.
//
//   const PeakFlops peak = peak_flops(Device("cuda:0"));
//   if (auto p = peak.at(Precision::BF16)) mfu = achieved / *p;
//
// GPUs are known by the name cudaGetDeviceProperties reports; the figures are the dense
// (no structured sparsity) tensor-core peaks of NVIDIA's datasheets, whose tables list the
// sparse figure, twice the dense one, for TF32/BF16/FP16; FP32 is the CUDA-core figure:
//   H100 SXM, H100 PCIe, H100 NVL: NVIDIA H100 Tensor Core GPU datasheet,
//     https://www.nvidia.com/en-us/data-center/h100/
//   H200 SXM, H200 NVL: NVIDIA H200 Tensor Core GPU, https://www.nvidia.com/en-us/data-center/h200/
//   A100 (40 and 80 GB, SXM and PCIe alike): NVIDIA A100 Tensor Core GPU datasheet,
//     https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
// llm.c keeps a table of the same kind (llmc/mfu.h, https://github.com/karpathy/llm.c).
//
// A GPU not in the table, the simulator (its timings are no GPU's, docs/cuda_simulator.md) and
// the CPU have no known peak: at() returns nothing and no MFU is printed. A CPU's peak (cores x
// clock x FMA width) depends on the clock it actually sustains under AVX-512 load, which Linux
// does not report reliably, so Kiln does not guess one.
#pragma once

#include <optional>
#include <string>

#include "engine/autocast.h"
#include "engine/device.h"

namespace kiln {

struct PeakFlops {
  std::string device_name;  // "NVIDIA H100 80GB HBM3", "Kiln CUDA simulator", "cpu"
  bool simulated = false;   // the CUDA simulator: timings (and so any MFU) are meaningless
  // FLOP/s, dense; 0 where unknown.
  double fp32 = 0, tf32 = 0, bf16 = 0, fp16 = 0;

  std::optional<double> at(Precision p) const;
};

// The table's entry for a GPU named `name` (cudaDeviceProp::name); peaks 0 for an unknown GPU.
PeakFlops gpu_peak_flops(const std::string& name);

// The device's peaks: the table for a CUDA device, marked simulated under the simulator;
// unknown for the CPU.
PeakFlops peak_flops(Device device);

}  // namespace kiln
