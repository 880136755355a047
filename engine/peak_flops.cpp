// peak_flops.cpp: the table of known GPUs (engine/peak_flops.h).
#include "engine/peak_flops.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "engine/build_config.h"
#include "engine/cuda/device_name.h"

namespace kiln {

namespace {

struct Known {
  const char* match;  // a substring of the upper-cased device name
  double fp32, tf32, bf16, fp16;  // TFLOP/s, dense
};

// Most specific first: "H100 PCIE" before "H100". The SXM parts report no form factor
// ("NVIDIA H100 80GB HBM3", "NVIDIA H200").
constexpr std::array<Known, 6> kKnown{{
    {"H200 NVL", 60, 417.5, 835.5, 835.5},
    {"H200", 67, 494.5, 989.5, 989.5},
    {"H100 PCIE", 51, 378, 756.5, 756.5},
    {"H100 NVL", 60, 417.5, 835.5, 835.5},
    {"H100", 67, 494.5, 989.5, 989.5},
    {"A100", 19.5, 156, 312, 312},
}};

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

}  // namespace

std::optional<double> PeakFlops::at(Precision p) const {
  if (simulated) return std::nullopt;
  double v = 0;
  switch (p) {
    case Precision::FP32: v = fp32; break;
    case Precision::TF32: v = tf32; break;
    case Precision::BF16: v = bf16; break;
    case Precision::FP16: v = fp16; break;
  }
  if (v <= 0) return std::nullopt;
  return v;
}

PeakFlops gpu_peak_flops(const std::string& name) {
  PeakFlops peak;
  peak.device_name = name;
  const std::string key = upper(name);
  for (const Known& k : kKnown) {
    if (key.find(k.match) == std::string::npos) continue;
    peak.fp32 = k.fp32 * 1e12, peak.tf32 = k.tf32 * 1e12;
    peak.bf16 = k.bf16 * 1e12, peak.fp16 = k.fp16 * 1e12;
    break;
  }
  return peak;
}

PeakFlops peak_flops(Device device) {
  if (device.type == DeviceType::CPU) {
    PeakFlops peak;
    peak.device_name = "cpu";
    return peak;
  }
  if constexpr (kWithCuda) {
    PeakFlops peak = gpu_peak_flops(cuda::device_name(device.index));
    peak.simulated = cuda::kSimulated;
    return peak;
  } else {
    PeakFlops peak;
    peak.device_name = "cuda (no CUDA backend in this build)";
    return peak;
  }
}

}  // namespace kiln
