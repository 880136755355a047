// dist_spec.cpp: fuzz target for mnist_train's --dist parser (apps/mnist/dist_flags.h: none,
// local:N, mpi, nccl, nccl:N with N = 1..64). The input is the flag's value. A Usage error is the
// expected answer to a bad value; a value that parses must give a known kind, 1..64 ranks, and
// threads exactly for local:N and nccl:N.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "apps/mnist/dist_flags.h"
#include "engine/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string value(reinterpret_cast<const char*>(data), size);
  kiln::apps::mnist::DistSpec d;
  try {
    d = kiln::apps::mnist::parse_dist(value);
  } catch (const kiln::Error& e) {
    if (e.kind() != kiln::ErrorKind::Usage) std::abort();
    return 0;
  }
  const bool known = d.kind == "none" || d.kind == "local" || d.kind == "mpi" || d.kind == "nccl";
  const bool threaded = value.find(':') != std::string::npos;
  if (!known || d.ranks < 1 || d.ranks > 64 || d.threads != threaded ||
      (!threaded && d.ranks != 1) || value.compare(0, d.kind.size(), d.kind) != 0) {
    std::abort();
  }
  return 0;
}
