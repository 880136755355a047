// impl_test.cpp: the hand/vendor setting (engine/impl.h): the per-thread guard, the process
// default every thread starts from, and the rules conv_impl and gemm_impl add to it.
#include "engine/impl.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "engine/error.h"
#include "engine/gemm_lowp_cpu.h"

namespace kiln {
namespace {

const Device kCpu;

TEST(Impl, GuardsNestAndRestore) {
  const Impl outside = current_impl();
  {
    KernelsGuard hand(Impl::Hand);
    EXPECT_EQ(current_impl(), Impl::Hand);
    {
      KernelsGuard vendor(Impl::Vendor);
      EXPECT_EQ(current_impl(), Impl::Vendor);
    }
    EXPECT_EQ(current_impl(), Impl::Hand);
  }
  EXPECT_EQ(current_impl(), outside);
  EXPECT_EQ(outside, default_impl());
}

TEST(Impl, DefaultIsVendorUnlessKilnKernelsSaysOtherwise) {
  if (const char* env = std::getenv("KILN_KERNELS"); env != nullptr && *env != '\0')
    EXPECT_EQ(default_impl(), parse_impl(env));
  else
    EXPECT_EQ(default_impl(), Impl::Vendor);  // in every build, the simulator's too
}

TEST(Impl, ANewThreadStartsAtTheDefaultNotAtItsCreatorsGuard) {
  KernelsGuard hand(Impl::Hand);
  KernelsGuard vendor(Impl::Vendor);
  Impl seen = Impl::Hand;
  std::thread t([&] { seen = current_impl(); });
  t.join();
  EXPECT_EQ(seen, default_impl());
  EXPECT_EQ(current_impl(), Impl::Vendor);
}

TEST(Impl, SetDefaultChangesThreadsWithoutAGuard) {
  const Impl saved = default_impl();
  for (Impl impl : {Impl::Hand, Impl::Vendor}) {
    set_default_impl(impl);
    EXPECT_EQ(current_impl(), impl);
    const Impl other = impl == Impl::Hand ? Impl::Vendor : Impl::Hand;
    KernelsGuard guard(other);  // the guard wins over the default
    EXPECT_EQ(current_impl(), other);
  }
  set_default_impl(saved);
}

TEST(Impl, TheRulesOfWhatExists) {
  const Device cuda(DeviceType::CUDA, 0);
  for (Impl impl : {Impl::Hand, Impl::Vendor}) {
    SCOPED_TRACE(impl_name(impl));
    KernelsGuard guard(impl);
    EXPECT_EQ(conv_impl(kCpu, DType::F32), impl);
    EXPECT_EQ(conv_impl(kCpu, DType::F64), Impl::Hand);  // oneDNN's convolution is f32 only
    EXPECT_EQ(conv_impl(cuda, DType::F64), impl);        // cuDNN has f64
    EXPECT_EQ(gemm_impl(kCpu, DType::F32), Impl::Hand);  // one CPU GEMM: OpenBLAS
    EXPECT_EQ(gemm_impl(cuda, DType::F32), impl);
    for (DType t : {DType::BF16, DType::F16}) {
      const bool onednn = cpu::lowp_gemm_path_available(cpu::LowpGemmPath::OneDnn, t);
      EXPECT_EQ(gemm_impl(kCpu, t), impl == Impl::Vendor && onednn ? Impl::Vendor : Impl::Hand)
          << dtype_name(t);
      EXPECT_EQ(gemm_impl(cuda, t), impl) << dtype_name(t);
    }
  }
}

TEST(Impl, ParseNamesAndRefusals) {
  EXPECT_EQ(parse_impl("hand"), Impl::Hand);
  EXPECT_EQ(parse_impl("vendor"), Impl::Vendor);
  EXPECT_STREQ(impl_name(Impl::Hand), "hand");
  EXPECT_STREQ(impl_name(Impl::Vendor), "vendor");
  try {
    parse_impl("fast");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use hand or vendor"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
