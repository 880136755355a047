// device.h: which device mnist_train trains on, and which kernels run there.
#pragma once

#include <string>

#include "engine/device.h"
#include "engine/impl.h"

namespace kiln::apps::mnist {

// "auto" -> cuda:0 when a real GPU is present, else the CPU (never the simulator: it is for
// tests, not training); "cuda[:N]" -> that device, or a usage error saying why it is missing.
Device resolve_device(const std::string& spec);

// The kernels the convolutions on `device` run (conv_impl of engine/impl.h, f32).
Impl impl_for(Device device);

}  // namespace kiln::apps::mnist
