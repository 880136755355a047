// checkpoint_tool: looks inside Kiln checkpoint files (engine/serialize.h) and compares them.
//
//   checkpoint_tool info FILE            meta entries (key=value, sorted) and one line per tensor
//                                        record: name, dtype, shape
//   checkpoint_tool get FILE KEY         the value of one meta entry (for scripts); when KEY names
//                                        a tensor instead, its dtype and shape, its first values
//                                        (--head N, default 10; 0 for none, -1 for all) and
//                                        min, max, mean and the count of NaN / infinite values
//   checkpoint_tool compare A B          "equal" and exit 0 when A and B hold the same tensors,
//                                        bit for bit (meta is not compared: it may hold timings);
//                                        else one line per differing record on stderr (for
//                                        tensors of one dtype and shape: how many elements
//                                        differ, the largest absolute and relative difference)
//                                        and exit 1
//   checkpoint_tool --help | --version
//
// Every file is fully validated on the way in (CRCs, sizes, layout): a damaged file is an
// error naming it (exit 2). tools/kill_resume.sh uses get and compare.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "apps/common/version.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/serialize.h"
#include "engine/tensor.h"

using namespace kiln;

namespace {

const char* const kUsage =
    "usage: checkpoint_tool info FILE | get FILE KEY [--head N] | compare A B | --help | "
    "--version\n"
    "  info FILE             meta entries and one line per tensor (name, dtype, shape)\n"
    "  get FILE KEY          a meta entry's value; for a tensor, its first N values (--head N,\n"
    "                        default 10; -1 for all) and min, max, mean, NaN and inf counts\n"
    "  compare A B           'equal' (exit 0), or per differing tensor the count of differing\n"
    "                        elements and the largest absolute and relative difference (exit 1)\n";

int usage() {
  std::fputs(kUsage, stderr);
  return 2;
}

int info(const std::string& path) {
  const Checkpoint c = read_checkpoint(path);
  for (const auto& [k, v] : c.meta) std::printf("%s=%s\n", k.c_str(), v.c_str());
  for (const auto& [name, t] : c.tensors) {
    std::printf("tensor %s %s %s\n", name.c_str(), dtype_name(t.dtype()),
                shape_str(t.shape()).c_str());
  }
  return 0;
}

// Every element as a double (exact for all of Kiln's dtypes but the largest 64-bit integers).
std::vector<double> values_of(const Tensor& t) {
  if (t.numel() == 0) return {};
  return t.to(DType::F64).to_vector<double>();
}

// A tensor's values for a reader: "tensor NAME DTYPE SHAPE (N elements)", the first `head`
// values, then the summary statistics of the finite ones.
void print_tensor(const std::string& name, const Tensor& t, long long head) {
  const std::vector<double> v = values_of(t);
  std::printf("tensor %s %s %s (%lld elements)\n", name.c_str(), dtype_name(t.dtype()),
              shape_str(t.shape()).c_str(), static_cast<long long>(v.size()));
  const size_t shown = head < 0 ? v.size() : std::min(v.size(), static_cast<size_t>(head));
  if (shown > 0) {
    std::printf(shown == v.size() ? "values:" : "first %zu:", shown);
    for (size_t i = 0; i < shown; ++i) std::printf(" %.9g", v[i]);
    std::printf("\n");
  }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0;
  size_t finite = 0, nan = 0, inf = 0;
  for (const double x : v) {
    if (std::isnan(x)) {
      ++nan;
    } else if (std::isinf(x)) {
      ++inf;
    } else {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      sum += x;
      ++finite;
    }
  }
  if (finite > 0) {
    std::printf("min %.9g  max %.9g  mean %.9g", lo, hi, sum / static_cast<double>(finite));
  } else {
    std::printf("no finite values");
  }
  std::printf("  nan %zu  inf %zu\n", nan, inf);
}

int get(const std::string& path, const std::string& key, long long head) {
  const Checkpoint c = read_checkpoint(path);
  if (auto it = c.meta.find(key); it != c.meta.end()) {
    std::printf("%s\n", it->second.c_str());
    return 0;
  }
  if (auto it = c.tensors.find(key); it != c.tensors.end()) {
    print_tensor(key, it->second, head);
    return 0;
  }
  throw Error("checkpoint '" + path + "' has no meta entry or tensor '" + key +
                  "' (checkpoint_tool info " + path + " lists them)",
              ErrorKind::Input);
}

// Two tensors of one dtype and shape whose bytes differ: how many elements differ (bit for bit)
// and by how much. The relative difference of an element is |a - b| / max(|a|, |b|) (0..2; 1
// where one of them is 0); elements where either side is NaN or infinite count as differing and
// are reported apart, as their differences are not numbers.
void describe_difference(const std::string& name, const Tensor& ta, const Tensor& tb) {
  const size_t esize = dtype_size(ta.dtype());
  const auto* pa = static_cast<const unsigned char*>(ta.raw_data());
  const auto* pb = static_cast<const unsigned char*>(tb.raw_data());
  const std::vector<double> a = values_of(ta), b = values_of(tb);
  size_t differ = 0, not_finite = 0;
  double max_abs = 0, max_rel = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(pa + i * esize, pb + i * esize, esize) == 0) continue;
    ++differ;
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      ++not_finite;
      continue;
    }
    const double d = std::fabs(a[i] - b[i]);
    const double scale = std::max(std::fabs(a[i]), std::fabs(b[i]));
    max_abs = std::max(max_abs, d);
    if (scale > 0) max_rel = std::max(max_rel, d / scale);
  }
  std::fprintf(stderr, "%s: %zu of %zu elements differ, max abs diff %.6g, max rel diff %.6g",
               name.c_str(), differ, a.size(), max_abs, max_rel);
  if (not_finite > 0) std::fprintf(stderr, " (%zu of them NaN or infinite)", not_finite);
  std::fprintf(stderr, "\n");
}

// Records present in one file only, or with another dtype, shape or bytes, are differences.
int compare(const std::string& a_path, const std::string& b_path) {
  const Checkpoint a = read_checkpoint(a_path), b = read_checkpoint(b_path);
  int differ = 0;
  for (const auto& [name, ta] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end()) {
      std::fprintf(stderr, "%s: only in %s\n", name.c_str(), a_path.c_str());
      ++differ;
      continue;
    }
    const Tensor& tb = it->second;
    if (ta.dtype() != tb.dtype() || ta.shape() != tb.shape()) {
      std::fprintf(stderr, "%s: %s %s vs %s %s\n", name.c_str(), dtype_name(ta.dtype()),
                   shape_str(ta.shape()).c_str(), dtype_name(tb.dtype()),
                   shape_str(tb.shape()).c_str());
      ++differ;
    } else if (ta.nbytes() > 0 && std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes()) != 0) {
      describe_difference(name, ta, tb);
      ++differ;
    }
  }
  for (const auto& [name, tb] : b.tensors) {
    if (!a.tensors.count(name)) {
      std::fprintf(stderr, "%s: only in %s\n", name.c_str(), b_path.c_str());
      ++differ;
    }
  }
  if (differ > 0) {
    std::fprintf(stderr, "checkpoint_tool: %d of the tensor records differ\n", differ);
    return 1;
  }
  std::printf("equal (%zu tensor records)\n", a.tensors.size());
  return 0;
}

// --head N: a whole number >= -1.
long long parse_head(const std::string& text) {
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || n < -1) {
    throw Error("--head must be a whole number, at least -1 (got " + text + ")",
                ErrorKind::Usage);
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (args.size() == 1 && args[0] == "--version") {
      std::printf("%s\n", apps::version_line("checkpoint_tool").c_str());
      return 0;
    }
    if (args.size() == 2 && args[0] == "info") return info(args[1]);
    if (args.size() == 3 && args[0] == "get") return get(args[1], args[2], 10);
    if (args.size() == 5 && args[0] == "get" && args[3] == "--head") {
      return get(args[1], args[2], parse_head(args[4]));
    }
    if (args.size() == 3 && args[0] == "compare") return compare(args[1], args[2]);
    return usage();
  } catch (const Error& e) {
    std::fprintf(stderr, "checkpoint_tool: error: %s\n", e.what());
    return 2;
  }
}
