// device.cpp: see device.h.
#include "apps/mnist/device.h"

#include <CLI/CLI.hpp>

#include <string>

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

void check_device_flags(const Options& o, const CLI::App& app, const DistSpec& d, Device device) {
  if (o.cuda_graph && d.kind != "none") {
    throw Error("--cuda-graph replays one device's step, and --dist " + o.dist + " exchanges "
                "gradients between ranks inside it: drop one of them", ErrorKind::Usage);
  }
  if (o.cuda_graph && !device.is_cuda()) {
    throw Error("--cuda-graph replays the training step as a CUDA graph, and this run trains on " +
                device.str() + " (--device " + o.device + "): pass --device cuda (or cuda:N), "
                "or drop --cuda-graph", ErrorKind::Usage);
  }
  if (!o.data_on_device) return;
  if (d.kind != "none") {
    throw Error("--data-on-device keeps the data set in one GPU's memory and --dist " + o.dist +
                " trains on several ranks: drop one of them", ErrorKind::Usage);
  }
  if (!device.is_cuda()) {
    throw Error("--data-on-device keeps the data set in GPU memory, and this run trains on " +
                device.str() + " (--device " + o.device + "): pass --device cuda (or cuda:N), "
                "or drop --data-on-device (on the CPU the loader reads from memory already)",
                ErrorKind::Usage);
  }
  if (o.format != "idx") {
    throw Error("--data-on-device copies the bytes of the four MNIST IDX files to the GPU and "
                "normalises them there; --format " + o.format + " goes through the loader's "
                "decoding and transforms: use --format idx, or drop --data-on-device",
                ErrorKind::Usage);
  }
  for (const char* flag : {"--workers", "--prefetch", "--pin-memory"}) {
    if (app.count(flag) > 0) {
      throw Error(std::string(flag) + " sets up the loader, and with --data-on-device no loader "
                  "runs (a kernel gathers each batch on the GPU): drop " + flag,
                  ErrorKind::Usage);
    }
  }
}

}  // namespace kiln::apps::mnist
