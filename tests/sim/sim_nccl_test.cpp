// sim_nccl_test.cpp: the simulator's NCCL (engine/cuda/sim/nccl.h), ranks as threads of this
// process, each on its own simulated device.
//
//   - ncclAllReduce sum and avg in f32, f64, f16 and bf16 against a CPU reference, 2 and 3 ranks
//     (3 ranks need KILN_SIM_DEVICES >= 3: sim_nccl_test_4_devices runs them), in place and
//     out of place; ncclBroadcast;
//   - a ring of ncclSend/ncclRecv inside a group (without the group every rank's send would
//     wait for a receive that is never posted);
//   - errors: a receive of another size than the send, collectives that differ between ranks,
//     host / other-device / too-small buffers and a stream of another device (refused at the
//     call), an id from nowhere, two ranks on one device;
//   - ncclCommAbort releases a rank waiting for it, and the failure is reported.
// A failure found on the stream is returned by the call under synchronous streams and by the
// stream's synchronisation under asynchronous ones; the tests accept either, and always ask
// ncclCommGetAsyncError, which reports it in both cases.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/host_device.h"
#include "engine/cuda/nccl.h"
#include "engine/cuda/runtime.h"

namespace {

int devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

#define SKIP_WITHOUT_DEVICES(n)                                                             \
  do {                                                                                      \
    if (devices() < (n))                                                                    \
      GTEST_SKIP() << "needs " << (n) << " simulated devices (KILN_SIM_DEVICES), have "     \
                   << devices();                                                            \
  } while (0)

// One rank: its thread's device is `rank`, with a communicator and a stream there.
struct Rank {
  int rank = 0;
  int size = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

// Runs fn on n threads, rank r on device r, after every rank joined one communicator.
void on_ranks(int n, const std::function<void(Rank&)>& fn) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Rank k;
      k.rank = r;
      k.size = n;
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      ASSERT_EQ(ncclCommInitRank(&k.comm, n, id, r), ncclSuccess) << ncclGetLastError(nullptr);
      ASSERT_EQ(cudaStreamCreate(&k.stream), cudaSuccess);
      fn(k);
      (void)cudaStreamSynchronize(k.stream);
      if (k.comm != nullptr) {
        EXPECT_EQ(ncclCommDestroy(k.comm), ncclSuccess);
      }
      EXPECT_EQ(cudaStreamDestroy(k.stream), cudaSuccess);
      // A test whose NCCL work failed left a sticky fault on the device: clear it for the next
      // test of this process.
      EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Device memory of the calling thread's device, filled from / read into host vectors.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, n * sizeof(T)), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  T* get() const { return p_; }
  std::vector<T> read() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  size_t n_;
  T* p_ = nullptr;
};

// The call's result, or else the stream's: where a failure on the stream shows up.
bool failed(ncclResult_t call, const Rank& k) {
  const cudaError_t sync = cudaStreamSynchronize(k.stream);
  (void)cudaGetLastError();
  return call != ncclSuccess || sync != cudaSuccess;
}

ncclResult_t async_error(const Rank& k) {
  ncclResult_t e = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(k.comm, &e), ncclSuccess);
  return e;
}

// Small values with halves: every partial sum is exact in f16, bf16, f32 and f64.
double input(int r, size_t i) { return static_cast<double>((r * 5 + i * 3) % 11) - 5 + 0.5 * r; }

// The element types, with their host conversions and the reference average of a sum.
struct F32 {
  using T = float;
  static constexpr ncclDataType_t type = ncclFloat32;
  static T from(double v) { return static_cast<float>(v); }
  static double to(T v) { return v; }
  static T average(T sum, int n) { return sum / static_cast<float>(n); }
};
struct F64 {
  using T = double;
  static constexpr ncclDataType_t type = ncclFloat64;
  static T from(double v) { return v; }
  static double to(T v) { return v; }
  static T average(T sum, int n) { return sum / n; }
};
struct F16 {
  using T = uint16_t;
  static constexpr ncclDataType_t type = ncclFloat16;
  static T from(double v) { return kiln::f32_to_f16(static_cast<float>(v)); }
  static double to(T v) { return kiln::f16_to_f32(v); }
  static T average(T sum, int n) {
    return kiln::f32_to_f16(kiln::f16_to_f32(sum) / static_cast<float>(n));
  }
};
struct BF16 {
  using T = uint16_t;
  static constexpr ncclDataType_t type = ncclBfloat16;
  static T from(double v) { return kiln::f32_to_bf16(static_cast<float>(v)); }
  static double to(T v) { return kiln::bf16_to_f32(v); }
  static T average(T sum, int n) {
    return kiln::f32_to_bf16(kiln::bf16_to_f32(sum) / static_cast<float>(n));
  }
};

// Every rank allreduces input(rank, i); the result must be the reference on every rank.
template <typename E>
void check_allreduce(int n, ncclRedOp_t op, bool in_place) {
  using T = typename E::T;
  for (size_t count : {size_t{1}, size_t{1000}, size_t{4099}}) {
    std::vector<T> want(count);
    for (size_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += input(r, i);
      want[i] = op == ncclAvg ? E::average(E::from(sum), n) : E::from(sum);
    }
    on_ranks(n, [&](Rank& k) {
      std::vector<T> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = E::from(input(k.rank, i));
      DeviceBuffer<T> send(mine);
      DeviceBuffer<T> out(count);
      T* dst = in_place ? send.get() : out.get();
      ASSERT_EQ(ncclAllReduce(send.get(), dst, count, E::type, op, k.comm, k.stream), ncclSuccess)
          << ncclGetLastError(k.comm);
      ASSERT_EQ(cudaStreamSynchronize(k.stream), cudaSuccess);
      const std::vector<T> got = in_place ? send.read() : out.read();
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) wrong += got[i] != want[i];
      EXPECT_EQ(wrong, 0u) << "rank " << k.rank << " of " << n << ", " << count << " elements, "
                           << (op == ncclAvg ? "avg" : "sum") << ", first: " << E::to(got[0])
                           << " want " << E::to(want[0]);
    });
  }
}

template <typename E>
void check_every_allreduce(int n) {
  for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
    check_allreduce<E>(n, op, /*in_place=*/false);
    check_allreduce<E>(n, op, /*in_place=*/true);
  }
}

TEST(SimNccl, AllReduceTwoRanksF32) { SKIP_WITHOUT_DEVICES(2); check_every_allreduce<F32>(2); }
TEST(SimNccl, AllReduceTwoRanksF64) { SKIP_WITHOUT_DEVICES(2); check_every_allreduce<F64>(2); }
TEST(SimNccl, AllReduceTwoRanksF16) { SKIP_WITHOUT_DEVICES(2); check_every_allreduce<F16>(2); }
TEST(SimNccl, AllReduceTwoRanksBF16) { SKIP_WITHOUT_DEVICES(2); check_every_allreduce<BF16>(2); }
TEST(SimNccl, AllReduceThreeRanksF32) { SKIP_WITHOUT_DEVICES(3); check_every_allreduce<F32>(3); }
TEST(SimNccl, AllReduceThreeRanksF64) { SKIP_WITHOUT_DEVICES(3); check_every_allreduce<F64>(3); }
TEST(SimNccl, AllReduceThreeRanksF16) { SKIP_WITHOUT_DEVICES(3); check_every_allreduce<F16>(3); }
TEST(SimNccl, AllReduceThreeRanksBF16) { SKIP_WITHOUT_DEVICES(3); check_every_allreduce<BF16>(3); }

TEST(SimNccl, BroadcastFromTheRoot) {
  SKIP_WITHOUT_DEVICES(2);
  on_ranks(2, [](Rank& k) {
    std::vector<double> mine(777);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = input(k.rank, i);
    DeviceBuffer<double> buf(mine);
    ASSERT_EQ(ncclBroadcast(buf.get(), buf.get(), mine.size(), ncclFloat64, 1, k.comm, k.stream),
              ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(k.stream), cudaSuccess);
    const std::vector<double> got = buf.read();
    size_t wrong = 0;
    for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != input(1, i);
    EXPECT_EQ(wrong, 0u) << "rank " << k.rank;
  });
}

// Each rank sends to the next and receives from the previous, in one group, several times
// over (the k-th send meets the k-th receive), with a self-send on the side.
TEST(SimNccl, SendRecvRingInAGroup) {
  SKIP_WITHOUT_DEVICES(2);
  const int n = devices() >= 3 ? 3 : 2;
  on_ranks(n, [n](Rank& k) {
    const int next = (k.rank + 1) % n, prev = (k.rank + n - 1) % n;
    for (size_t count : {size_t{1}, size_t{513}, size_t{100000}}) {
      std::vector<float> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(input(k.rank, i));
      DeviceBuffer<float> out(mine), in(count), self(count);
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclSend(out.get(), count, ncclFloat32, next, k.comm, k.stream), ncclSuccess);
      ASSERT_EQ(ncclRecv(in.get(), count, ncclFloat32, prev, k.comm, k.stream), ncclSuccess);
      ASSERT_EQ(ncclSend(out.get(), count, ncclFloat32, k.rank, k.comm, k.stream), ncclSuccess);
      ASSERT_EQ(ncclRecv(self.get(), count, ncclFloat32, k.rank, k.comm, k.stream), ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(k.comm);
      ASSERT_EQ(cudaStreamSynchronize(k.stream), cudaSuccess);
      const std::vector<float> got = in.read(), back = self.read();
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        wrong += got[i] != static_cast<float>(input(prev, i));
        wrong += back[i] != mine[i];
      }
      EXPECT_EQ(wrong, 0u) << "rank " << k.rank << ", " << count << " elements";
    }
    EXPECT_EQ(async_error(k), ncclSuccess);
  });
}

TEST(SimNccl, ReceiveOfAnotherSizeThanTheSendFailsBothRanks) {
  SKIP_WITHOUT_DEVICES(2);
  on_ranks(2, [](Rank& k) {
    DeviceBuffer<float> buf(8);
    const ncclResult_t rc = k.rank == 0
                                ? ncclSend(buf.get(), 8, ncclFloat32, 1, k.comm, k.stream)
                                : ncclRecv(buf.get(), 4, ncclFloat32, 0, k.comm, k.stream);
    EXPECT_TRUE(failed(rc, k)) << "rank " << k.rank << ": a 32-byte send met a 16-byte receive";
    EXPECT_EQ(async_error(k), ncclInvalidUsage);
    const std::string why = ncclGetLastError(k.comm);
    EXPECT_NE(why.find("32 bytes"), std::string::npos) << why;
    EXPECT_NE(why.find("16 bytes"), std::string::npos) << why;
  });
}

TEST(SimNccl, CollectivesThatDifferBetweenRanksFail) {
  SKIP_WITHOUT_DEVICES(2);
  on_ranks(2, [](Rank& k) {
    DeviceBuffer<float> buf(10);
    const size_t count = k.rank == 0 ? 10 : 9;
    const ncclResult_t rc =
        ncclAllReduce(buf.get(), buf.get(), count, ncclFloat32, ncclSum, k.comm, k.stream);
    EXPECT_TRUE(failed(rc, k)) << "rank " << k.rank;
    EXPECT_EQ(async_error(k), ncclInvalidUsage);
    const std::string why = ncclGetLastError(k.comm);
    EXPECT_NE(why.find("differs between ranks"), std::string::npos) << why;
  });
}

// Refused at the call, before anything is queued: no rank waits for these.
TEST(SimNccl, BadBuffersAndStreamsAreRefusedAtTheCall) {
  SKIP_WITHOUT_DEVICES(2);
  on_ranks(2, [](Rank& k) {
    std::vector<float> host(16);
    DeviceBuffer<float> small(4);
    const int other = 1 - k.rank;
    ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
    float* elsewhere = nullptr;
    ASSERT_EQ(cudaMalloc(&elsewhere, 64), cudaSuccess);
    cudaStream_t other_stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&other_stream), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(k.rank), cudaSuccess);
    DeviceBuffer<float> good(16);

    auto expect_refused = [&](ncclResult_t rc, const char* says) {
      EXPECT_EQ(rc, ncclInvalidArgument) << says;
      const std::string why = ncclGetLastError(nullptr);
      EXPECT_NE(why.find(says), std::string::npos) << why;
    };
    expect_refused(ncclSend(host.data(), 16, ncclFloat32, other, k.comm, k.stream),
                   "not device memory");
    expect_refused(ncclAllReduce(elsewhere, good.get(), 16, ncclFloat32, ncclSum, k.comm,
                                 k.stream), "not of the communicator's device");
    expect_refused(ncclRecv(small.get(), 16, ncclFloat32, other, k.comm, k.stream),
                   "holds 16 bytes, the call needs 64");
    expect_refused(ncclSend(good.get(), 16, ncclFloat32, 2, k.comm, k.stream), "peer 2");
    expect_refused(ncclAllReduce(good.get(), good.get(), 16, ncclFloat32, ncclSum, k.comm,
                                 other_stream), "the stream belongs to device");
    // 10 is NCCL's ncclFloat8e4m3, which the simulator does not move.
    expect_refused(ncclAllReduce(good.get(), good.get(), 16, static_cast<ncclDataType_t>(10),
                                 ncclSum, k.comm, k.stream), "data type");

    // In a group, the refused call fails the whole group and nothing of it is queued.
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclSend(good.get(), 16, ncclFloat32, other, k.comm, k.stream), ncclSuccess);
    EXPECT_EQ(ncclRecv(host.data(), 16, ncclFloat32, other, k.comm, k.stream),
              ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
    EXPECT_EQ(cudaStreamSynchronize(k.stream), cudaSuccess);
    EXPECT_EQ(async_error(k), ncclSuccess);

    // A valid exchange still works afterwards: nothing was left half-matched.
    DeviceBuffer<float> in(16);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(good.get(), 16, ncclFloat32, other, k.comm, k.stream), ncclSuccess);
    ASSERT_EQ(ncclRecv(in.get(), 16, ncclFloat32, other, k.comm, k.stream), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(k.comm);
    EXPECT_EQ(cudaStreamSynchronize(k.stream), cudaSuccess);

    ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(other_stream), cudaSuccess);
    EXPECT_EQ(cudaFree(elsewhere), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(k.rank), cudaSuccess);
  });
}

TEST(SimNccl, InitRankRefusesAnIdFromNowhereAndTwoRanksOnOneDevice) {
  SKIP_WITHOUT_DEVICES(1);
  ncclComm_t comm = nullptr;
  ncclUniqueId junk{};
  EXPECT_EQ(ncclCommInitRank(&comm, 1, junk, 0), ncclInvalidArgument);
  EXPECT_EQ(comm, nullptr);

  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclResult_t rc[2] = {ncclSuccess, ncclSuccess};
  ncclComm_t comms[2] = {nullptr, nullptr};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(0);  // both on device 0
      rc[r] = ncclCommInitRank(&comms[r], 2, id, r);
    });
  }
  for (std::thread& t : threads) t.join();
  // One rank is refused for the duplicate device, the other released instead of waiting.
  EXPECT_NE(rc[0], ncclSuccess);
  EXPECT_NE(rc[1], ncclSuccess);
  EXPECT_TRUE(rc[0] == ncclInvalidUsage || rc[1] == ncclInvalidUsage);
}

// Rank 1 waits in an allreduce that rank 0 never joins; rank 0 aborts. Rank 1's operation
// fails (its async error says a peer failed) instead of waiting forever.
TEST(SimNccl, AbortReleasesARankWaitingInARendezvous) {
  SKIP_WITHOUT_DEVICES(2);
  using Clock = std::chrono::steady_clock;
  on_ranks(2, [](Rank& k) {
    DeviceBuffer<float> buf(64);
    if (k.rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 1 is waiting by now
      EXPECT_EQ(ncclCommAbort(k.comm), ncclSuccess);
      k.comm = nullptr;
      return;
    }
    const auto start = Clock::now();
    const ncclResult_t rc =
        ncclAllReduce(buf.get(), buf.get(), 64, ncclFloat32, ncclSum, k.comm, k.stream);
    EXPECT_TRUE(failed(rc, k));
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0);
    EXPECT_EQ(async_error(k), ncclRemoteError);
    const std::string why = ncclGetLastError(k.comm);
    EXPECT_NE(why.find("ncclCommAbort"), std::string::npos) << why;
  });
}

}  // namespace
