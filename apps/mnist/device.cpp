// device.cpp: see device.h.
#include "apps/mnist/device.h"

#include "engine/cuda/context.h"
#include "engine/error.h"

namespace kiln::apps::mnist {

Device resolve_device(const std::string& spec) {
  if (spec == "auto") {
    return !cuda::kSimulated && cuda::is_available() ? Device(DeviceType::CUDA, 0)
                                               : Device(DeviceType::CPU, 0);
  }
  Device d = parse_device(spec);
  if (d.is_cuda()) {
    if (!cuda::is_available()) {
      throw Error("--device " + spec + ": " + cuda::unavailable_reason(), ErrorKind::Usage);
    }
    cuda::check_device(d.index);
  }
  return d;
}

Impl impl_for(Device device) { return conv_impl(device, DType::F32); }

}  // namespace kiln::apps::mnist
