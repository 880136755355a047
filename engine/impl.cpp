#include "engine/impl.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "engine/error.h"

namespace kiln {
namespace {
std::atomic<int> g_impl{-1};
}

Impl parse_impl(const char* name) {
  std::string s = name ? name : "";
  if (s == "hand") return Impl::Hand;
  if (s == "vendor") return Impl::Vendor;
  throw Error("invalid kernel implementation '" + s + "': use hand or vendor", ErrorKind::Usage);
}

Impl kernel_impl() {
  int v = g_impl.load();
  if (v < 0) {
    const char* env = std::getenv("KILN_KERNELS");
    v = static_cast<int>(env && *env ? parse_impl(env) : Impl::Vendor);
    g_impl.store(v);
  }
  return static_cast<Impl>(v);
}

void set_kernel_impl(Impl impl) { g_impl.store(static_cast<int>(impl)); }

const char* impl_name(Impl impl) { return impl == Impl::Hand ? "hand" : "vendor"; }

}  // namespace kiln
