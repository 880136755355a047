// fixture.h: reads the golden fixtures that tests/reference/make_fixtures.py writes with
// PyTorch (tests/reference/fixtures/<case>.kfix), returning each record as a kiln::Tensor.
//
// File format KILNFIX1 (all integers little-endian; also documented in make_fixtures.py):
//
//     bytes 0..7   magic "KILNFIX1"
//     u32          version (1)
//     u32          number of records
//     then, per record:
//       u32        name length L, then L bytes of name (ASCII, unique within the file)
//       u8         dtype: 0 f32, 1 f64, 2 i32, 3 i64, 4 u8   (the order of kiln::DType)
//       u8         rank R (0..8)
//       u16        reserved, 0
//       i64 x R    shape
//       u64        payload size in bytes (= numel * dtype size)
//       payload    raw little-endian elements, row-major (contiguous)
//
// Hyper-parameters travel in the same file as one-element records (stride: i64, momentum:
// f64), so the Python case and the C++ test cannot drift apart.
//
// Where the files are: $KILN_SOURCE_DIR/tests/reference/fixtures (ctest sets it, see
// tests/CMakeLists.txt), else the compile definition KILN_SOURCE_DIR, else next to this header
// (__FILE__), so a test binary run by hand still finds them. Every problem (missing file,
// bad magic, truncated record, missing record) throws kiln::Error naming the file and what to do.
// Header-only; host little-endian is assumed (x86-64 and AArch64 both are).
// Also here: close() and equal(), the per-tensor comparisons the parity tests use.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/tensor.h"

namespace kiln::testing {

// The folder that holds the committed fixtures.
inline std::filesystem::path fixture_dir() {
  namespace fs = std::filesystem;
  if (const char* src = std::getenv("KILN_SOURCE_DIR"); src != nullptr && *src != '\0')
    return fs::path(src) / "tests" / "reference" / "fixtures";
#ifdef KILN_SOURCE_DIR
  return fs::path(KILN_SOURCE_DIR) / "tests" / "reference" / "fixtures";
#else
  // This header is tests/support/fixture.h: the fixtures are ../reference/fixtures.
  return fs::path(__FILE__).parent_path().parent_path() / "reference" / "fixtures";
#endif
}

class Fixture {
 public:
  static constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'F', 'I', 'X', '1'};
  static constexpr uint32_t kVersion = 1;

  // Loads fixture_dir()/<name>.kfix, or the file at `name` if it already ends in ".kfix".
  explicit Fixture(const std::string& name) {
    namespace fs = std::filesystem;
    path_ = name.size() > 5 && name.compare(name.size() - 5, 5, ".kfix") == 0
                ? fs::path(name)
                : fixture_dir() / (name + ".kfix");
    std::ifstream in(path_, std::ios::binary);
    KILN_CHECK_INPUT(in.good(), "fixture ", path_.string(),
                     " cannot be opened: generate the fixtures with "
                     "`/usr/bin/python3 tests/reference/make_fixtures.py` (resnet_*: "
                     "make_resnet_fixtures.py; Debian's python3 with python3-torch and "
                     "python3-torchvision), or set KILN_SOURCE_DIR to the source tree");
    bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    parse();
  }

  const std::filesystem::path& path() const { return path_; }
  bool has(const std::string& name) const { return records_.count(name) != 0; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& kv : records_) out.push_back(kv.first);
    return out;
  }

  // A fresh CPU tensor (a copy: tests may modify it) holding the record `name`.
  Tensor tensor(const std::string& name) const { return get(name).clone(); }
  // A fresh leaf tensor with requires_grad on (for inputs and parameters).
  Tensor leaf(const std::string& name) const {
    Tensor t = tensor(name);
    t.set_requires_grad(true);
    return t;
  }
  // A one-element record (a hyper-parameter) as int64 or double.
  int64_t integer(const std::string& name) const {
    const Tensor& t = get(name);
    KILN_CHECK_INPUT(t.numel() == 1 && !is_floating(t.dtype()), "fixture ", path_.string(),
                     ": record '", name, "' is ", t.str(), ", expected one integer");
    return static_cast<int64_t>(t.item());
  }
  double real(const std::string& name) const {
    const Tensor& t = get(name);
    KILN_CHECK_INPUT(t.numel() == 1, "fixture ", path_.string(), ": record '", name, "' is ",
                     t.str(), ", expected one number");
    return t.item();
  }

 private:
  const Tensor& get(const std::string& name) const {
    auto it = records_.find(name);
    if (it == records_.end()) {
      std::string have;
      for (const auto& kv : records_) have += (have.empty() ? "" : ", ") + kv.first;
      throw Error(detail::str("fixture ", path_.string(), " has no record '", name,
                              "' (it has: ", have,
                              "): regenerate it with `/usr/bin/python3 "
                              "tests/reference/make_fixtures.py`"),
                  ErrorKind::Input);
    }
    return it->second;
  }

  // Copies n bytes at the cursor into dst, or throws naming the truncated field.
  void read(void* dst, size_t n, const char* what) {
    KILN_CHECK_INPUT(pos_ + n <= bytes_.size(), "fixture ", path_.string(), " is truncated: ",
                     what, " needs ", n, " bytes at offset ", pos_, " but the file has ",
                     bytes_.size(), ": regenerate it with `/usr/bin/python3 "
                     "tests/reference/make_fixtures.py`");
    std::memcpy(dst, bytes_.data() + pos_, n);
    pos_ += n;
  }
  template <typename T>
  T read_pod(const char* what) {
    T v{};
    read(&v, sizeof(T), what);
    return v;
  }

  void parse() {
    const std::string file = path_.string();
    char magic[8];
    read(magic, 8, "the magic");
    KILN_CHECK_INPUT(std::memcmp(magic, kMagic, 8) == 0, "fixture ", file,
                     " does not start with the magic KILNFIX1: not a Kiln fixture");
    const auto version = read_pod<uint32_t>("the version");
    KILN_CHECK_INPUT(version == kVersion, "fixture ", file, " has format version ", version,
                     ", this reader knows ", kVersion,
                     ": regenerate it with `/usr/bin/python3 tests/reference/make_fixtures.py`");
    const auto count = read_pod<uint32_t>("the record count");
    for (uint32_t r = 0; r < count; ++r) {
      const auto name_len = read_pod<uint32_t>("a record name length");
      KILN_CHECK_INPUT(name_len > 0 && name_len <= 256, "fixture ", file, ": record ", r,
                       " has a name length of ", name_len, " (expected 1..256): corrupt file");
      std::string name(name_len, '\0');
      read(name.data(), name_len, "a record name");
      const auto code = read_pod<uint8_t>("a dtype");
      const auto rank = read_pod<uint8_t>("a rank");
      read_pod<uint16_t>("the reserved field");
      KILN_CHECK_INPUT(code <= static_cast<uint8_t>(DType::U8), "fixture ", file, ": record '",
                       name, "' has unknown dtype code ", int(code));
      KILN_CHECK_INPUT(rank <= 8, "fixture ", file, ": record '", name, "' has rank ",
                       int(rank), " (at most 8)");
      Shape shape(rank);
      for (auto& d : shape) {
        d = read_pod<int64_t>("a dimension");
        KILN_CHECK_INPUT(d >= 0, "fixture ", file, ": record '", name,
                         "' has a negative dimension");
      }
      const DType dtype = static_cast<DType>(code);
      const auto nbytes = read_pod<uint64_t>("a payload size");
      const uint64_t expected = static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype);
      KILN_CHECK_INPUT(nbytes == expected, "fixture ", file, ": record '", name, "' (",
                       dtype_name(dtype), " ", shape_str(shape), ") holds ", nbytes,
                       " bytes, expected ", expected, ": corrupt file");
      KILN_CHECK_INPUT(records_.count(name) == 0, "fixture ", file, ": record '", name,
                       "' appears twice");
      Tensor t = Tensor::empty(shape, dtype);
      read(t.raw_data(), static_cast<size_t>(nbytes), "a payload");
      records_.emplace(name, t);
    }
    KILN_CHECK_INPUT(pos_ == bytes_.size(), "fixture ", file, " has ", bytes_.size() - pos_,
                     " bytes after its last record: corrupt file");
  }

  std::filesystem::path path_;
  std::vector<char> bytes_;
  size_t pos_ = 0;
  std::map<std::string, Tensor> records_;
};

// ---- Comparing with a reference -------------------------------------------------------

// KILN_PARITY_VERBOSE=1: print the measured error of every comparison.
inline bool verbose() {
  const char* v = std::getenv("KILN_PARITY_VERBOSE");
  return v != nullptr && *v != '\0' && *v != '0';
}

// Compares a Kiln tensor with PyTorch's, element by element. Element i passes when
//     |actual_i - expected_i| <= rtol * (|expected_i| + max_j |expected_j|)
// (relative to the element and to the tensor's scale: the rounding error of a sum grows with
// its terms, not its result; see pytorch_parity_test.cpp for the tolerances used).
// Names the case, the tensor, the worst element and its two values on failure.
inline ::testing::AssertionResult close(const std::string& what, const Tensor& actual,
                                 const Tensor& expected, double rtol) {
  if (!actual.defined())
    return ::testing::AssertionFailure() << what << ": Kiln produced no tensor (undefined)";
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(actual.shape())
                                         << " but PyTorch's is " << shape_str(expected.shape());
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure() << what << ": dtype " << dtype_name(actual.dtype())
                                         << " but PyTorch's is "
                                         << dtype_name(expected.dtype());
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  double scale = 0;
  for (double v : e) scale = std::max(scale, std::fabs(v));
  double worst = 0, max_abs = 0;  // worst: error / (|e| + scale)
  size_t worst_i = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    const double err = std::fabs(a[i] - e[i]);
    const double denom = std::fabs(e[i]) + scale;
    const double ratio = denom > 0 ? err / denom : (err > 0 ? INFINITY : 0);
    if (!(ratio <= worst)) {  // also catches NaN
      worst = ratio;
      worst_i = i;
    }
    max_abs = std::max(max_abs, err);
  }
  if (verbose())
    std::printf("  %-48s max|err| %.3e  err/(|e|+max|e|) %.3e  (rtol %.0e)\n", what.c_str(),
                max_abs, worst, rtol);
  if (worst <= rtol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": element " << worst_i << " of " << shape_str(expected.shape()) << " is "
         << a[worst_i] << " but PyTorch says " << e[worst_i] << " (error/(|e|+max|e|) = "
         << worst << " > rtol " << rtol << "; max |error| " << max_abs << ")";
}

// Exact equality, for integer tensors (indices, counters).
inline ::testing::AssertionResult equal(const std::string& what, const Tensor& actual,
                                 const Tensor& expected) {
  if (!actual.defined() || actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << what << ": shape mismatch ("
                                         << (actual.defined() ? shape_str(actual.shape()) : "-")
                                         << " vs " << shape_str(expected.shape()) << ")";
  const auto a = actual.to_vector<int64_t>();
  const auto e = expected.to_vector<int64_t>();
  for (size_t i = 0; i < e.size(); ++i)
    if (a[i] != e[i])
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << a[i]
                                           << " but PyTorch says " << e[i];
  return ::testing::AssertionSuccess();
}

}  // namespace kiln::testing
