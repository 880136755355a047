// sim/launch.h: runs a kernel launch on the CPU (what `kernel<<<grid, block, shared, stream>>>`
// does on a GPU). Called by kiln::cuda::launch (engine/cuda/launch.h) under the simulator.
// Follows the Programming Guide's "Execution Configuration" and its limits per compute
// capability (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#execution-configuration).
//
//   kiln::sim::launch(grid, block, shared_bytes, stream, my_kernel<float>, args...);
//
// The launch is checked like a GPU checks it (block size and shape, grid size, dynamic shared
// memory against 48 KiB or the kernel's cudaFuncSetAttribute limit, the stream's device) and
// a violation throws kiln::Error naming the grid, block, shared bytes and the limit. Pointer
// arguments are checked too: each must be null or point into live memory of the current device
// (or pinned host memory) - catching a freed buffer, a CPU pointer or a tensor on another
// device at the launch instead of as a wrong result (env KILN_SIM_CHECK_POINTERS=0 turns it off).
//
// Then the grid is queued on the stream and launch returns, as on a GPU: the stream's worker
// thread runs every block later (blocks in parallel on a small pool of OS threads, the threads
// of a block as fibers of one OS thread). If a kernel throws, or the block's threads disagree
// on a barrier, that is a device fault: the device's sticky error, reported (with the text) by
// the next synchronising call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "engine/cuda/sim/runtime.h"

namespace kiln::sim {

// One launch, type-erased: `invoke(payload)` runs the kernel body for the current fiber.
struct KernelLaunch {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
  const void* kernel = nullptr;  // identifies the kernel (for cudaFuncSetAttribute limits)
  void (*invoke)(const void* payload) = nullptr;
  std::shared_ptr<const void> payload;  // the kernel and a copy of its arguments
};

// Validates the configuration (throws kiln::Error) and queues the grid on its stream
// (grid.cpp, scheduler.cpp).
void run_kernel(const KernelLaunch& launch);

// Throws kiln::Error unless `p` is null, inside a live allocation of the current device, or
// inside pinned host memory. `index` is the argument's position (for the message).
void check_kernel_pointer(const void* p, int index);
bool pointer_checks_enabled();

namespace detail {
template <typename T>
struct identity {
  using type = T;
};
template <typename T>
void check_argument(const T& arg, int index) {
  if constexpr (std::is_pointer_v<T> && !std::is_function_v<std::remove_pointer_t<T>>) {
    check_kernel_pointer(const_cast<const void*>(static_cast<const volatile void*>(arg)), index);
  }
}
}  // namespace detail

// The arguments are not deduced (identity): they take the kernel's parameter types, so an int64_t
// passed for an int parameter converts as it would for a real launch.
template <typename... Params>
void launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            void (*kernel)(Params...), typename detail::identity<Params>::type... args) {
  if (pointer_checks_enabled()) {
    int index = 0;
    (detail::check_argument(args, index++), ...);
  }
  // Each simulated thread calls the kernel with its own copies of the arguments (std::apply
  // copies out of the shared tuple), as each GPU thread gets its own parameter registers.
  struct Payload {
    void (*kernel)(Params...);
    std::tuple<Params...> args;
  };
  auto payload = std::make_shared<const Payload>(Payload{kernel, std::tuple<Params...>(args...)});
  KernelLaunch l;
  l.grid = grid;
  l.block = block;
  l.shared_bytes = shared_bytes;
  l.stream = stream;
  l.kernel = reinterpret_cast<const void*>(kernel);
  l.invoke = [](const void* p) {
    const Payload& pl = *static_cast<const Payload*>(p);
    std::apply(pl.kernel, pl.args);
  };
  l.payload = std::move(payload);
  run_kernel(l);
}

}  // namespace kiln::sim
