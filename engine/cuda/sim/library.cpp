// sim/library.cpp: the helpers the simulated vendor libraries share (see library.h).
// Models no library call itself (cuBLAS: https://docs.nvidia.com/cuda/cublas/; cuDNN:
// https://docs.nvidia.com/deeplearning/cudnn/api/).
#include "engine/cuda/sim/library.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "engine/cuda/sim/library_error.h"
#include "engine/cuda/sim/internal.h"
#include "engine/error.h"

namespace kiln::sim {
namespace {
thread_local std::string t_library_error;
}  // namespace

void set_library_error(std::string why) { t_library_error = std::move(why); }
void clear_library_error() { t_library_error.clear(); }
const char* last_library_error() { return t_library_error.c_str(); }

bool device_range_ok(const char* what, const void* p, size_t bytes, int device,
                     std::string* why) {
  if (bytes == 0) return true;
  const std::string name(what);
  if (p == nullptr) {
    *why = name + " is null";
    return false;
  }
  const Region r = find_region(p);
  if (r.kind != MemoryKind::Device) {
    *why = name + " is not device memory (a host pointer, or freed)";
    return false;
  }
  if (r.device != device) {
    *why = name + " is memory of device " + std::to_string(r.device) + ", the handle's is " +
           std::to_string(device);
    return false;
  }
  const size_t offset = static_cast<size_t>(static_cast<const char*>(p) - r.begin);
  if (offset + bytes > r.size) {
    *why = name + " needs " + std::to_string(bytes) + " bytes from offset " +
           std::to_string(offset) + " of its allocation of " + std::to_string(r.size) +
           " bytes: " + std::to_string(offset + bytes - r.size) + " bytes past its end";
    return false;
  }
  return true;
}

void require_device_range(const char* call, const char* what, const void* p, size_t bytes,
                          int device) {
  std::string why;
  if (!device_range_ok(what, p, bytes, device, &why))
    throw Error(std::string(call) + " when it ran on its stream: " + why);
}

std::string stream_problem(cudaStream_t stream, int device) {
  if (current_device() != device)
    return "the current device is " + std::to_string(current_device()) +
           ", the handle belongs to device " + std::to_string(device);
  int stream_dev = 0;
  if (!stream_device(stream, &stream_dev)) return "the handle's stream was destroyed";
  if (stream_dev != device)
    return "the handle's stream belongs to device " + std::to_string(stream_dev) +
           ", the handle to device " + std::to_string(device);
  return "";
}

float round_tf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x1000u;       // half of the 13 dropped bits: ties go away from zero
  bits &= 0xFFFFE000u;   // keep sign, exponent and 10 mantissa bits
  std::memcpy(&x, &bits, sizeof bits);
  return x;
}

}  // namespace kiln::sim
