// device.h: which device mnist_train trains on, which kernels run there, and the flags that
// only a GPU can honour.
#pragma once

#include <string>

#include "apps/mnist/dist_flags.h"
#include "apps/mnist/options.h"
#include "engine/device.h"
#include "engine/impl.h"

namespace CLI {
class App;
}

namespace kiln::apps::mnist {

// "auto" -> cuda:0 when a real GPU is present, else the CPU (never the simulator: it is for
// tests, not training); "cuda[:N]" -> that device, or a usage error saying why it is missing.
Device resolve_device(const std::string& spec);

// The kernels the convolutions on `device` run (conv_impl of engine/impl.h, f32).
Impl impl_for(Device device);

// --data-on-device needs one CUDA device (--dist none, the resolved `device` a GPU), the IDX
// files (it copies their bytes) and no loader flags (no loader runs); --cuda-graph needs one
// CUDA device. Otherwise a Usage error naming the flag and what to do.
//
// Why --cuda-graph is not the default on a GPU, although a replay trains exactly as the eager
// step (the same kernels on the same values: tests/apps/mnist_train_device_step_test.cpp):
// the eager step is the one a reader follows and debugs (an error names the op that failed;
// in a replay, only the graph), --trace splits it into forward, backward and optimizer (a
// replay is one span), and the graph holds a second set of the step's buffers in its private
// pool. A run that wants the speed asks for it, as with PyTorch's CUDA graphs and
// torch.compile(mode="reduce-overhead").
void check_device_flags(const Options& o, const CLI::App& app, const DistSpec& d, Device device);

}  // namespace kiln::apps::mnist
