// tensor_cuda_test.cpp: tensors on CUDA devices and the runtime layer under them.
//
// Copies are compared as bytes: a copy, a fill and a dtype conversion are exact operations
// (one static_cast per element, the same on the host and the device), so no tolerance is
// allowed. Covered: device discovery and its errors (cuda:7), the device guard, per-thread
// streams and the stream guard, events; round trips of every dtype host -> cuda:0 -> cuda:1 ->
// host; conversion of every dtype pair on the device == on the host, for host->device,
// device->host, on one device and across devices; fill_, zeros/ones/full, from_vector, item,
// to_vector, clone; pinned memory and non_blocking copies; autograd through to(device); two
// host threads at once; and the cuBLAS/cuDNN handles (simulated under the simulator) and the
// TF32 switch.
// Tests that need cuda:1 skip on a one-GPU machine; all skip without a GPU (real CUDA build).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/cuda/check.h"
#include "engine/cuda/context.h"
#include "engine/cuda/pinned_allocator.h"
#include "engine/cuda/blas.h"
#include "engine/cuda/dnn.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "parity/parity_harness.h"
#include "support/cuda_skip.h"
#if KILN_CUDA_SIM
#include "engine/cuda/launch.h"  // a kernel of the test's own, simulator only
#endif

namespace kiln {
namespace {

const Device kCpu(DeviceType::CPU, 0);
const Device kCuda0(DeviceType::CUDA, 0);
const Device kCuda1(DeviceType::CUDA, 1);
const DType kAllDTypes[] = {DType::F32, DType::F64, DType::I32, DType::I64, DType::U8};

// Copies are compared byte for byte (parity_harness.h), naming the first differing element.
using kiln::testing::bit_identical;

// A host tensor of random bytes: every bit pattern, NaN payloads included, must survive a copy.
Tensor random_bytes(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype, kCpu);
  std::mt19937 gen(seed);
  auto* p = static_cast<unsigned char*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(gen());
  return t;
}

// Values every dtype can hold (0..250), with fractions when the dtype is floating, so every
// conversion is defined (see engine/cuda/kernels/copy.h).
Tensor convertible_values(int64_t n, DType dtype, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(0.0, 250.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = is_floating(dtype) ? dist(gen) : std::floor(dist(gen));
  return Tensor::from_vector(v, {n}).to(dtype);
}

Error expect_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a kiln::Error";
  return Error("");
}

// ---- Devices, guards, streams, events --------------------------------------------------------

TEST(CudaContext, DeviceQueries) {
  KILN_SKIP_WITHOUT_CUDA();
  EXPECT_GE(cuda::device_count(), 1);
  EXPECT_EQ(cuda::unavailable_reason(), "");
  EXPECT_NO_THROW(cuda::check_device(0));
}

TEST(CudaContext, MissingDeviceNamesWhatExists) {
  KILN_SKIP_WITHOUT_CUDA();
  const int n = cuda::device_count();
  const std::string have =
      n == 1 ? "this machine has 1 CUDA device (cuda:0)"
             : "this machine has " + std::to_string(n) + " CUDA devices (cuda:0..cuda:" +
                   std::to_string(n - 1) + ")";
  const int missing = n <= 7 ? 7 : n;
  const std::string want = "device cuda:" + std::to_string(missing) + " is not available: " + have +
                           "; pick one of those, or use --device cpu";
  Error e = expect_error([&] { cuda::check_device(missing); });
  EXPECT_EQ(std::string(e.what()), want);
  EXPECT_EQ(e.kind(), ErrorKind::Usage);
  // The same error from every way of reaching the device.
  e = expect_error([&] { Tensor::zeros({2}, DType::F32, Device(DeviceType::CUDA, missing)); });
  EXPECT_EQ(std::string(e.what()), want);
  e = expect_error([&] { Tensor::ones({2}).to(Device(DeviceType::CUDA, missing)); });
  EXPECT_EQ(std::string(e.what()), want);
  e = expect_error([&] { cuda::DeviceGuard guard(missing); });
  EXPECT_EQ(std::string(e.what()), want);
  EXPECT_EQ(expect_error([&] { cuda::check_device(-1); }).kind(), ErrorKind::Usage);
}

TEST(CudaContext, DeviceGuardRestoresThePreviousDevice) {
  KILN_SKIP_WITHOUT_CUDA();
  const int last = cuda::device_count() - 1;
  ASSERT_EQ(cuda::current_device(), 0);
  {
    cuda::DeviceGuard guard(last);
    EXPECT_EQ(cuda::current_device(), last);
    {
      cuda::DeviceGuard inner(0);
      EXPECT_EQ(cuda::current_device(), 0);
    }
    EXPECT_EQ(cuda::current_device(), last);
  }
  EXPECT_EQ(cuda::current_device(), 0);
}

TEST(CudaContext, OneStreamPerThreadAndDevice) {
  KILN_SKIP_WITHOUT_CUDA();
  cudaStream_t mine = cuda::current_stream();
  ASSERT_NE(mine, nullptr);  // never the legacy default stream
  EXPECT_EQ(cuda::current_stream(), mine);
  EXPECT_EQ(cuda::current_stream(0), mine);
  cudaStream_t other_thread = nullptr;
  std::thread([&] { other_thread = cuda::current_stream(0); }).join();
  EXPECT_NE(other_thread, nullptr);
  EXPECT_NE(other_thread, mine);
  if (cuda::device_count() >= 2) {
    cudaStream_t on_1 = cuda::current_stream(1);
    EXPECT_NE(on_1, mine);
    cuda::DeviceGuard guard(1);
    EXPECT_EQ(cuda::current_stream(), on_1);
  }
}

TEST(CudaContext, StreamGuardSendsTheScopesWorkToAnotherStream) {
  KILN_SKIP_WITHOUT_CUDA();
  cudaStream_t mine = cuda::current_stream(0);
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  {
    cuda::StreamGuard guard(0, a);
    EXPECT_EQ(cuda::current_stream(), a);
    EXPECT_EQ(cuda::current_stream(0), a);
    // Ops queue on the guarded stream: a tensor's block is allocated for it.
    Tensor t = Tensor::full({8}, 2.0, DType::F32, Device(DeviceType::CUDA, 0));
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(8, 2.0f));
    {
      cuda::StreamGuard inner(0, b);
      EXPECT_EQ(cuda::current_stream(0), b);
    }
    EXPECT_EQ(cuda::current_stream(0), a);
    // Another thread, and another device, keep their own streams.
    cudaStream_t other_thread = nullptr;
    std::thread([&] { other_thread = cuda::current_stream(0); }).join();
    EXPECT_NE(other_thread, a);
    if (cuda::device_count() >= 2) {
      EXPECT_NE(cuda::current_stream(1), a);
    }
  }
  EXPECT_EQ(cuda::current_stream(0), mine);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(a), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
}

TEST(CudaContext, EventsOrderStreamsAndTime) {
  KILN_SKIP_WITHOUT_CUDA();
  cuda::Event never;
  EXPECT_TRUE(never.query());  // an event never recorded is complete
  never.wait();                // and waiting on it is a no-op
  never.synchronize();

  cuda::Event start(cuda::EventTiming::On), end(cuda::EventTiming::On);
  start.record();
  Tensor t = Tensor::full({1 << 16}, 2.5, DType::F32, kCuda0);
  end.record();
  end.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_EQ(end.device(), 0);
  EXPECT_GE(start.elapsed_ms(end), 0.0f);
  EXPECT_THROW(never.elapsed_ms(end), Error);  // timing off, not recorded

  // Another thread's stream waits for this thread's fill before it reads the tensor.
  cuda::Event filled;
  t.fill_(7.0);
  filled.record();
  std::vector<float> seen;
  std::thread([&] {
    filled.wait();  // this thread's current_stream() waits for the fill
    seen = t.to_vector<float>();
  }).join();
  ASSERT_EQ(seen.size(), size_t{1 << 16});
  EXPECT_EQ(seen.front(), 7.0f);
  EXPECT_EQ(seen.back(), 7.0f);
}

// ---- Copies ----------------------------------------------------------------------------------

TEST(TensorCuda, RoundTripEveryDtypeIsBitExact) {
  KILN_SKIP_WITHOUT_CUDA();
  const bool two = cuda::device_count() >= 2;
  uint32_t seed = 1;
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : std::vector<Shape>{{0}, {1}, {3, 5}, {257}, {1 << 17, 3}}) {
      const Tensor host = random_bytes(shape, dtype, ++seed);
      const std::string what = std::string(dtype_name(dtype)) + " " + shape_str(shape);
      const Tensor on0 = host.to(kCuda0);
      EXPECT_EQ(on0.device(), kCuda0);
      EXPECT_TRUE(bit_identical(what + " (host -> cuda:0 -> host)", on0.to(kCpu), host));
      if (!two) continue;
      const Tensor on1 = on0.to(kCuda1);
      EXPECT_EQ(on1.device(), kCuda1);
      EXPECT_TRUE(bit_identical(what + " (cuda:1 -> host)", on1.to(kCpu), host));
      EXPECT_TRUE(bit_identical(what + " (cuda:1 -> cuda:0)", on1.to(kCuda0).to(kCpu), host));
    }
  }
}

// Channels-last on the device: the same bytes as on the host (the conversion is a transpose
// kernel, per element size), kept by copies and element-wise ops, read back in NCHW order.
TEST(TensorCuda, ChannelsLastBytesMatchTheHost) {
  KILN_SKIP_WITHOUT_CUDA();
  uint32_t seed = 300;
  for (DType dtype : kAllDTypes) {
    const Tensor host = random_bytes({3, 5, 7, 2}, dtype, ++seed);
    const std::string what = std::string(dtype_name(dtype)) + " channels-last";
    const Tensor host_cl = host.to(MemoryFormat::ChannelsLast);
    const Tensor dev_cl = host.to(kCuda0).to(MemoryFormat::ChannelsLast);
    ASSERT_TRUE(dev_cl.is_channels_last());
    EXPECT_TRUE(bit_identical(what + " bytes", dev_cl.storage_order_view().to(kCpu),
                              host_cl.storage_order_view()));
    EXPECT_TRUE(bit_identical(what + " -> host", dev_cl.to(kCpu).contiguous(), host));
    EXPECT_TRUE(dev_cl.to(kCpu).is_channels_last());
  }
  const Tensor a =
      Tensor::full({2, 3, 4, 4}, 1.5, DType::F32, kCuda0).to(MemoryFormat::ChannelsLast);
  const Tensor sum = add(a, a);
  EXPECT_TRUE(sum.is_channels_last());
  for (float v : sum.to_vector<float>()) EXPECT_EQ(v, 3.0f);
}

TEST(TensorCuda, ConversionOnDeviceEqualsHostConversion) {
  KILN_SKIP_WITHOUT_CUDA();
  const bool two = cuda::device_count() >= 2;
  const int64_t n = 1037;  // four blocks of 256 and a partial one
  uint32_t seed = 100;
  for (DType from : kAllDTypes) {
    const Tensor src = convertible_values(n, from, ++seed);
    const Tensor src0 = src.to(kCuda0);
    for (DType to : kAllDTypes) {
      const std::string pair = std::string(dtype_name(from)) + " -> " + dtype_name(to);
      const Tensor want = src.to(to);  // the host conversion
      // On one device: to(dtype).
      const Tensor on_device = src0.to(to);
      EXPECT_EQ(on_device.device(), kCuda0);
      EXPECT_TRUE(bit_identical(pair + " (to(dtype) on cuda:0)", on_device, want));
      // Host -> device with conversion.
      Tensor h2d = Tensor::empty({n}, to, kCuda0);
      h2d.copy_(src);
      EXPECT_TRUE(bit_identical(pair + " (host -> cuda:0)", h2d, want));
      // Device -> host with conversion.
      Tensor d2h = Tensor::empty({n}, to, kCpu);
      d2h.copy_(src0);
      EXPECT_TRUE(bit_identical(pair + " (cuda:0 -> host)", d2h, want));
      // to_vector converts too.
      EXPECT_EQ(src0.to_vector<double>(), src.to_vector<double>()) << pair;
      if (!two) continue;
      Tensor peer = Tensor::empty({n}, to, kCuda1);
      peer.copy_(src0);
      EXPECT_TRUE(bit_identical(pair + " (cuda:0 -> cuda:1)", peer, want));
    }
  }
}

TEST(TensorCuda, FillEveryDtypeLikeTheHost) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dtype : kAllDTypes) {
    std::vector<double> values = {0.0, 1.0, 3.0, 250.0};
    if (is_floating(dtype)) values.insert(values.end(), {-0.0, 2.5, -1e-3, 1e30, INFINITY});
    if (dtype != DType::U8) values.push_back(-7.0);
    for (double v : values) {
      // 4096 * 256 + 3 elements make the capped grid wrap (kernels/copy.cu): once per path.
      const bool wrap = v == 0.0 || v == 3.0;
      for (int64_t n : {int64_t{1}, int64_t{1000}, wrap ? int64_t{4096 * 256 + 3} : int64_t{0}}) {
        Tensor t = Tensor::empty({n}, dtype, kCuda0);
        t.fill_(v);
        Tensor want = Tensor::empty({n}, dtype, kCpu);
        want.fill_(v);
        EXPECT_TRUE(bit_identical(std::string(dtype_name(dtype)) + " fill " +
                                      ::testing::PrintToString(v) + " n " + std::to_string(n),
                                  t, want));
      }
    }
  }
}

TEST(TensorCuda, FactoriesItemAndToVector) {
  KILN_SKIP_WITHOUT_CUDA();
  EXPECT_EQ(Tensor::zeros({3, 4}, DType::F64, kCuda0).to_vector<double>(), std::vector<double>(12, 0.0));
  EXPECT_EQ(Tensor::ones({5}, DType::I64, kCuda0).to_vector<int64_t>(), std::vector<int64_t>(5, 1));
  EXPECT_EQ(Tensor::full({2}, 9.5, DType::F32, kCuda0).to_vector<float>(), std::vector<float>(2, 9.5f));
  const Tensor v = Tensor::from_vector<int32_t>({1, -2, 3, -4, 5, -6}, {2, 3}, kCuda0);
  EXPECT_EQ(v.device(), kCuda0);
  EXPECT_EQ(v.dtype(), DType::I32);
  EXPECT_EQ(v.shape(), (Shape{2, 3}));
  EXPECT_EQ(v.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, -4, 5, -6}));
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{1, -2, 3, -4, 5, -6}));
  EXPECT_EQ(Tensor::full({1}, -3.25, DType::F64, kCuda0).item(), -3.25);
  EXPECT_EQ(Tensor::from_vector<uint8_t>({200}, {1, 1}, kCuda0).item(), 200.0);
  EXPECT_THROW(Tensor::zeros({2}, DType::F32, kCuda0).item(), Error);  // not one element
  EXPECT_EQ(Tensor::empty({0, 3}, DType::F32, kCuda0).to_vector<float>().size(), 0u);
  // A reshape shares the device storage.
  EXPECT_EQ(v.reshape({3, 2}).to_vector<int32_t>(), v.to_vector<int32_t>());
}

TEST(TensorCuda, CloneIsADeepCopyOnTheSameDevice) {
  KILN_SKIP_WITHOUT_CUDA();
  const Device last(DeviceType::CUDA, cuda::device_count() - 1);
  for (Device d : {kCuda0, last}) {
    Tensor a = Tensor::from_vector<float>({1, 2, 3}, {3}, d);
    Tensor b = a.clone();
    EXPECT_EQ(b.device(), d);
    EXPECT_NE(b.raw_data(), a.raw_data());
    a.fill_(0.0);
    EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{1, 2, 3}));
    EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 0, 0}));
    // copy_ within one device, and to(dtype) keeps the device.
    a.copy_(b);
    EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2, 3}));
    EXPECT_EQ(a.to(DType::F64).device(), d);
  }
}

TEST(TensorCuda, GradientFlowsBackThroughToDevice) {
  KILN_SKIP_WITHOUT_CUDA();
  Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3});
  x.set_requires_grad(true);
  Tensor y = x.to(kCuda0);
  ASSERT_TRUE(y.requires_grad());
  y.backward(Tensor::from_vector<double>({0.5, -1, 2}, {3}, kCuda0));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().device(), kCpu);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0.5, -1, 2}));
}

// ---- Pinned memory and non_blocking copies ---------------------------------------------------

TEST(TensorCuda, PinMemory) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor host = random_bytes({1000}, DType::F32, 7);
  EXPECT_FALSE(host.is_pinned());
  const MemoryStats before = pinned_allocator::stats();
  const Tensor pinned = host.pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_EQ(pinned.device(), kCpu);  // pinned tensors are CPU tensors
  EXPECT_TRUE(bit_identical("pin_memory()", pinned, host));
  EXPECT_TRUE(pinned.pin_memory().same(pinned));  // already pinned: itself
  EXPECT_TRUE(pinned_allocator::owns(pinned.raw_data()));
  MemoryStats during = pinned_allocator::stats();
  EXPECT_EQ(during.current_bytes - before.current_bytes,
            static_cast<int64_t>(pinned_allocator::round_size(4000)));
  // Plain host ops work on pinned tensors.
  EXPECT_TRUE(bit_identical("clone() of pinned", pinned.clone(), host));
  EXPECT_FALSE(pinned.clone().is_pinned());
  // Freed blocks are reused for the same size: the second pair needs no new cudaHostAlloc.
  { Tensor a = host.pin_memory(), b = host.pin_memory(); EXPECT_NE(a.raw_data(), b.raw_data()); }
  const int64_t after_first_pair = pinned_allocator::stats().os_allocs;
  { Tensor c = host.pin_memory(), d = host.pin_memory(); }
  EXPECT_EQ(pinned_allocator::stats().os_allocs, after_first_pair);
  EXPECT_EQ(pinned_allocator::stats().current_bytes, during.current_bytes);
  // Only CPU tensors can be pinned.
  EXPECT_EQ(expect_error([&] { host.to(kCuda0).pin_memory(); }).kind(), ErrorKind::Usage);
}

#if KILN_CUDA_SIM
// Waits until *open != 0, then faults (the simulator reports a kernel that throws as a device
// fault): the device's context fails with a sticky error, as a GPU's does after an illegal
// address. Simulator only: on a GPU a planted fault would end the context for the process.
__global__ void fault_when_open_kernel(const int* open) {
  while (__atomic_load_n(open, __ATOMIC_ACQUIRE) == 0) {
  }
  throw Error("a planted kernel fault");
}

// A pinned block whose stream faulted before the block's copy ran is freed without an
// exception: its event will never complete, the device runs nothing more, and a tensor's
// destructor must not throw (as when ranks that lose a peer mid-step free their batches,
// tools/rank_death.sh). The device's next synchronising call still reports the fault.
TEST(TensorCuda, APinnedBlockOnAFailedDeviceIsFreedWithoutThrowing) {
  const cudaStream_t stream = cuda::current_stream();
  void* block = pinned_allocator::allocate(4096);
  int* open = static_cast<int*>(block);  // the kernel's flag: pinned memory, which kernels read
  __atomic_store_n(open, 0, __ATOMIC_RELEASE);
  cuda::launch(fault_when_open_kernel, cuda::LaunchConfig{dim3(1), dim3(1), 0, stream}, open);
  pinned_allocator::record_stream(block, stream);  // the block's event, behind the fault
  __atomic_store_n(open, 1, __ATOMIC_RELEASE);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorLaunchFailure);
  EXPECT_NO_THROW(pinned_allocator::deallocate(block));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);  // the fault stays the device's
  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
}
#endif

TEST(TensorCuda, NonBlockingCopiesThroughPinnedMemory) {
  KILN_SKIP_WITHOUT_CUDA();
  const Tensor host = random_bytes({1 << 16}, DType::F64, 11);
  // Host -> device from pinned memory: asynchronous; the stream orders it before later work.
  const Tensor pinned = host.pin_memory();
  const Tensor on_device = pinned.to(kCuda0, /*non_blocking=*/true);
  const Tensor doubled = on_device.to(DType::F32);  // queued after the copy on the same stream
  cuda::synchronize();
  EXPECT_TRUE(bit_identical("pinned -> cuda:0, non_blocking", on_device, host));
  EXPECT_TRUE(bit_identical("to(F32) after the copy", doubled, host.to(DType::F32)));

  // Device -> pinned host: asynchronous; read after an event.
  Tensor back = Tensor::empty(host.shape(), DType::F64, kCpu).pin_memory();
  back.copy_(on_device, /*non_blocking=*/true);
  cuda::Event done;
  done.record(cuda::current_stream(0));
  done.synchronize();
  EXPECT_TRUE(bit_identical("cuda:0 -> pinned, non_blocking", back, host));

  // A pinned source freed right after an asynchronous copy: its block is not handed out again
  // (and overwritten) before the copy has read it. A host function holds the stream, so the
  // copy is still queued when the block could be reused.
  static std::atomic<int> open{0};
  open = 0;
  {
    cuda::DeviceGuard guard(0);
    KILN_CUDA_CHECK(cudaLaunchHostFunc(
        cuda::current_stream(),
        [](void*) {
          while (open.load() == 0) std::this_thread::yield();
        },
        nullptr));
  }
  Tensor copied;
  {
    const Tensor temp = random_bytes(host.shape(), DType::F64, 12).pin_memory();
    copied = temp.to(kCuda0, true);
  }
  const Tensor reuse = random_bytes(host.shape(), DType::F64, 13).pin_memory();
  open = 1;
  cuda::synchronize();
  EXPECT_TRUE(bit_identical("copy of a freed pinned source", copied,
                            random_bytes(host.shape(), DType::F64, 12)));
  EXPECT_TRUE(bit_identical("pinned block allocated after it", reuse,
                            random_bytes(host.shape(), DType::F64, 13)));

  // non_blocking without pinned memory is synchronous: the data is there on return.
  EXPECT_TRUE(bit_identical("unpinned -> cuda:0, non_blocking", host.to(kCuda0, true), host));
  const Tensor to_host = on_device.to(kCpu, true);
  EXPECT_FALSE(to_host.is_pinned());
  EXPECT_EQ(std::memcmp(to_host.raw_data(), host.raw_data(), host.nbytes()), 0);
  // Pinned with conversion, both ways.
  Tensor as_f32 = Tensor::empty(host.shape(), DType::F32, kCpu).pin_memory();
  as_f32.copy_(on_device, true);
  const Tensor f32_device = pinned.to(kCuda0, true).to(DType::F32);
  cuda::synchronize();
  EXPECT_TRUE(bit_identical("cuda:0 -> pinned F32", as_f32, host.to(DType::F32)));
  EXPECT_TRUE(bit_identical("pinned -> cuda:0, then to(F32)", f32_device, host.to(DType::F32)));
}

TEST(TensorCuda, PeerCopiesFollowTheProducer) {
  KILN_SKIP_WITHOUT_CUDA_DEVICES(2);
  // Written on cuda:0's stream, copied by cuda:1's stream with no host synchronisation between.
  for (int round = 0; round < 4; ++round) {
    Tensor a = Tensor::empty({100003}, DType::F32, kCuda0);
    a.fill_(round + 0.5);
    Tensor b = a.to(kCuda1);
    a.fill_(-1.0);  // queued after the copy has read a (the copy made cuda:0's stream wait)
    EXPECT_EQ(b.to_vector<float>(), std::vector<float>(100003, round + 0.5f));
    EXPECT_EQ(a.to_vector<float>(), std::vector<float>(100003, -1.0f));
  }
}

TEST(TensorCuda, TwoHostThreadsAtOnce) {
  KILN_SKIP_WITHOUT_CUDA();
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      const Device d(DeviceType::CUDA, i % cuda::device_count());
      bool good = true;
      for (int step = 0; step < 20; ++step) {
        Tensor t = Tensor::full({513 + i}, i * 100 + step, DType::I64, d);
        Tensor u = t.to(DType::F64).clone();
        good = good && u.to_vector<int64_t>() == std::vector<int64_t>(513 + i, i * 100 + step);
      }
      ok[static_cast<size_t>(i)] = good ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

// ---- Library handles -------------------------------------------------------------------------
TEST(CudaLibraries, Tf32IsOffUnlessSwitchedOn) {
  if (std::getenv("KILN_TF32")) GTEST_SKIP() << "KILN_TF32 is set in the environment";
  EXPECT_FALSE(cuda::tf32_enabled());  // FP32 by default: results match the CPU's precision
  cuda::set_allow_tf32(true);
  EXPECT_TRUE(cuda::tf32_enabled());
  cuda::set_allow_tf32(false);
  EXPECT_FALSE(cuda::tf32_enabled());
}

TEST(CudaLibraries, HandlesPerThreadOnTheCurrentStream) {
  KILN_SKIP_WITHOUT_CUDA();
  cublasHandle_t blas = cuda::cublas_handle();
  EXPECT_EQ(cuda::cublas_handle(), blas);
  cudaStream_t stream = nullptr;
  KILN_CUBLAS_CHECK(cuda::cublas().get_stream(blas, &stream));
  EXPECT_EQ(stream, cuda::current_stream());
  cublasMath_t mode;
  KILN_CUBLAS_CHECK(cuda::cublas().get_math_mode(blas, &mode));
  EXPECT_EQ(mode, CUBLAS_DEFAULT_MATH);
  cuda::set_allow_tf32(true);
  KILN_CUBLAS_CHECK(cuda::cublas().get_math_mode(cuda::cublas_handle(), &mode));
  EXPECT_EQ(mode, CUBLAS_TF32_TENSOR_OP_MATH);
  cuda::set_allow_tf32(false);

  cudnnHandle_t dnn = cuda::cudnn_handle();
  EXPECT_EQ(cuda::cudnn_handle(), dnn);
  KILN_CUDNN_CHECK(cudnnGetStream(dnn, &stream));
  EXPECT_EQ(stream, cuda::current_stream());

  cublasHandle_t other_blas = nullptr;
  std::thread([&] { other_blas = cuda::cublas_handle(); }).join();
  EXPECT_NE(other_blas, blas);  // a handle is not shared between host threads
}

}  // namespace
}  // namespace kiln
