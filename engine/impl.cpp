// impl.cpp: the kernel implementation switch (hand or vendor), from set_kernel_impl or KILN_KERNELS.
#include "engine/impl.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "engine/build_config.h"
#include "engine/error.h"

namespace kiln {
namespace {
// kUnread: KILN_KERNELS not read yet; kDefault: nobody chose (env unset, no set_kernel_impl);
// otherwise the explicit choice, static_cast<int>(Impl).
constexpr int kUnread = -2;
constexpr int kDefault = -1;
std::atomic<int> g_impl{kUnread};

int resolved() {
  int v = g_impl.load();
  if (v == kUnread) {
    const char* env = std::getenv("KILN_KERNELS");
    v = env && *env ? static_cast<int>(parse_impl(env)) : kDefault;
    int expected = kUnread;
    if (!g_impl.compare_exchange_strong(expected, v)) v = expected;  // a setter won the race
  }
  return v;
}
}  // namespace

Impl parse_impl(const char* name) {
  std::string s = name ? name : "";
  if (s == "hand") return Impl::Hand;
  if (s == "vendor") return Impl::Vendor;
  throw Error("invalid kernel implementation '" + s + "': use hand or vendor", ErrorKind::Usage);
}

Impl kernel_impl() {
  int v = resolved();
  return v == kDefault ? Impl::Vendor : static_cast<Impl>(v);
}

Impl cuda_kernel_impl() {
  int v = resolved();
  if (cuda::kSimulated && v == kDefault) return Impl::Hand;  // the simulator runs our kernels
  return v == kDefault ? Impl::Vendor : static_cast<Impl>(v);
}

void set_kernel_impl(Impl impl) { g_impl.store(static_cast<int>(impl)); }

void reset_kernel_impl() { g_impl.store(kUnread); }

const char* impl_name(Impl impl) { return impl == Impl::Hand ? "hand" : "vendor"; }

}  // namespace kiln
