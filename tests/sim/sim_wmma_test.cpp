// sim_wmma_test.cpp: the simulator's warp matrix functions (engine/cuda/sim/mma.h) and 16-bit
// float types (sim/fp16.h): one warp's load / mma / store against a naive product for bf16 and
// f16 and every layout, the store's share rule (each element written by exactly its lane), the
// API's rules as faults (alignment, ldm, a partial warp), and KILN_SHARED honouring a 32-byte
// aligned type, which load_matrix_sync needs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cuda/mma.h"
#include "engine/cuda/launch.h"
#include "engine/cuda/runtime.h"
#include "engine/host_device.h"
#include "sim_test_kernels.h"

namespace {

namespace wmma = nvcuda::wmma;
using kiln::cuda::launch;
using kiln::cuda::LaunchConfig;
using kiln::sim_test::DeviceBuffer;

// d (16x16, stored col-major) = a b + c with a, b 16x16 bit patterns in the layouts LA / LB
// (row_major: (r, c) at r * 16 + c; col_major: at c * 16 + r) and c row- or col-major.
template <typename E, typename LA, typename LB>
__global__ void one_mma_kernel(const uint16_t* a, const uint16_t* b, const float* c, float* d,
                               bool c_row_major) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, E, LA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, E, LB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::load_matrix_sync(fa, reinterpret_cast<const E*>(a), 16);
  wmma::load_matrix_sync(fb, reinterpret_cast<const E*>(b), 16);
  wmma::load_matrix_sync(fc, c, 16, c_row_major ? wmma::mem_row_major : wmma::mem_col_major);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(d, fc, 16, wmma::mem_col_major);
}

template <typename E, typename LA, typename LB>
void check_one_mma(bool c_row_major) {
  const bool bf16 = std::is_same_v<E, __nv_bfloat16>;
  const bool a_row = std::is_same_v<LA, wmma::row_major>, b_row = std::is_same_v<LB, wmma::row_major>;
  // Small integers: every product and sum is exact, so the result must be exactly the naive one.
  std::vector<float> av(256), bv(256), cv(256);
  for (int i = 0; i < 256; ++i) {
    av[i] = static_cast<float>(i % 7 - 3);
    bv[i] = static_cast<float>(i % 5 - 2);
    cv[i] = static_cast<float>(i % 11);
  }
  auto bits = [&](const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out[i] = bf16 ? kiln::f32_to_bf16(v[i]) : kiln::f32_to_f16(v[i]);
    return out;
  };
  auto at = [](const std::vector<float>& v, bool row, int r, int c) {
    return v[row ? r * 16 + c : c * 16 + r];
  };
  DeviceBuffer<uint16_t> da(bits(av)), db(bits(bv));
  DeviceBuffer<float> dc(cv), dd(256);
  launch(one_mma_kernel<E, LA, LB>, LaunchConfig{1, 32, 0, nullptr}, da.get(), db.get(), dc.get(),
         dd.get(), c_row_major);
  const std::vector<float> d = dd.to_host();
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float want = at(cv, c_row_major, i, j);
      for (int p = 0; p < 16; ++p) want += at(av, a_row, i, p) * at(bv, b_row, p, j);
      ASSERT_EQ(d[j * 16 + i], want) << (bf16 ? "bf16" : "f16") << " A " << (a_row ? "row" : "col")
                                     << " B " << (b_row ? "row" : "col") << " C "
                                     << (c_row_major ? "row" : "col") << " at (" << i << ", " << j << ")";
    }
}

TEST(SimWmma, LoadMmaStoreMatchTheNaiveProductInEveryLayout) {
  for (bool c_row : {true, false}) {
    check_one_mma<__nv_bfloat16, wmma::row_major, wmma::row_major>(c_row);
    check_one_mma<__nv_bfloat16, wmma::col_major, wmma::row_major>(c_row);
    check_one_mma<__nv_bfloat16, wmma::row_major, wmma::col_major>(c_row);
    check_one_mma<__half, wmma::col_major, wmma::col_major>(c_row);
    check_one_mma<__half, wmma::row_major, wmma::row_major>(c_row);
  }
}

// Every lane fills its fragment with its own lane number, then stores: element (r, c) shows
// which lane wrote it.
__global__ void store_share_kernel(float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::fill_fragment(f, static_cast<float>(threadIdx.x % 32));
  wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
}

TEST(SimWmma, StoreWritesEachElementFromItsOwnLaneOnly) {
  DeviceBuffer<float> out(std::vector<float>(256, -1.0f));
  launch(store_share_kernel, LaunchConfig{1, 32, 0, nullptr}, out.get());
  const std::vector<float> got = out.to_host();
  std::vector<int> per_lane(32, 0);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      // The m16n8k16 accumulator layout: lane l holds rows l/4, l/4 + 8, columns 2(l%4) + {0,1,8,9}.
      const int lane = (r % 8) * 4 + (c % 8) / 2;
      ASSERT_EQ(got[r * 16 + c], static_cast<float>(lane)) << "(" << r << ", " << c << ")";
      ++per_lane[lane];
    }
  for (int l = 0; l < 32; ++l) EXPECT_EQ(per_lane[l], 8) << "lane " << l;
}

// A broken rule of the API faults the kernel, naming it (the text of the device's sticky fault).
template <typename F>
std::string fault_of(F launch_it) {
  launch_it();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  const std::string text = kiln::sim::fault_message();
  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
  return text;
}

__global__ void load_at_kernel(const uint16_t* p, unsigned ldm) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> f;
  wmma::load_matrix_sync(f, reinterpret_cast<const __half*>(p), ldm);
}

TEST(SimWmma, TheApiRulesAreFaults) {
  DeviceBuffer<uint16_t> m(16 * 40 + 16);  // cudaMalloc: at least 32-byte aligned
  const auto contains = [](const std::string& text, const char* what) {
    return text.find(what) != std::string::npos;
  };
  std::string f = fault_of([&] { launch(load_at_kernel, LaunchConfig{1, 32, 0, nullptr}, m.get() + 8, 16u); });
  EXPECT_TRUE(contains(f, "32-byte) aligned")) << f;
  f = fault_of([&] { launch(load_at_kernel, LaunchConfig{1, 32, 0, nullptr}, m.get(), 20u); });
  EXPECT_TRUE(contains(f, "not a multiple of 16 bytes")) << f;
  f = fault_of([&] { launch(load_at_kernel, LaunchConfig{1, 32, 0, nullptr}, m.get(), 8u); });
  EXPECT_TRUE(contains(f, "shorter than a row")) << f;
  f = fault_of([&] { launch(load_at_kernel, LaunchConfig{1, 16, 0, nullptr}, m.get(), 16u); });
  EXPECT_TRUE(contains(f, "every lane of the warp must take part")) << f;
  // The rules hold, the same call runs.
  launch(load_at_kernel, LaunchConfig{1, 32, 0, nullptr}, m.get(), 40u);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

struct alignas(32) Aligned32 {
  float v[8];
};

__global__ void shared_alignment_kernel(unsigned long long* out) {
  KILN_SHARED(char, first, [3]);  // pushes the next variable off a 32-byte boundary
  KILN_SHARED(Aligned32, second);
  if (threadIdx.x == 0) {
    first[0] = 1;
    out[0] = reinterpret_cast<uintptr_t>(&second) % 32;
  }
}

TEST(SimWmma, SharedVariablesKeepTheirTypesAlignment) {
  DeviceBuffer<unsigned long long> out(std::vector<unsigned long long>{99});
  launch(shared_alignment_kernel, LaunchConfig{1, 32, 0, nullptr}, out.get());
  EXPECT_EQ(out.to_host()[0], 0u);
}

TEST(SimWmma, HalfTypesConvertByTheSharedRules) {
  EXPECT_EQ(__bfloat16_as_ushort(__float2bfloat16(1.0f)), 0x3f80);
  EXPECT_EQ(__half_as_ushort(__float2half(1.0f)), 0x3c00);
  EXPECT_EQ(__half_as_ushort(__float2half(65520.0f)), 0x7c00);  // rounds to infinity
  EXPECT_EQ(__bfloat162float(__float2bfloat16(1.0f + 1.0f / 256)), 1.0f);  // tie to even
  EXPECT_EQ(__half2float(__ushort_as_half(0x0001)), std::ldexp(1.0f, -24));  // subnormal kept
}

}  // namespace
