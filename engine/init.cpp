// init.cpp: random initialisation from the Philox generator, and the default generator.
//
// Every draw goes through Generator::reserve + philox_u32 + uniform01: element i of a tensor
// filled by uniform_ is a pure function of (seed, base + i/4, i%4), so the result does not
// depend on the thread count or the device, and manual_seed(s) reproduces it bit for bit.
// Numbers are generated on the host; a tensor on another device gets a host copy copied in.
#include "engine/init.h"

#include <cmath>
#include <cstdint>

#include "engine/error.h"

namespace kiln {

namespace {
thread_local Generator* t_scoped_generator = nullptr;  // set by GeneratorScope
}  // namespace

Generator& default_generator() {
  if (t_scoped_generator != nullptr) return *t_scoped_generator;
  static Generator gen;
  return gen;
}

GeneratorScope::GeneratorScope(Generator& gen) : prev_(t_scoped_generator) {
  t_scoped_generator = &gen;
}

GeneratorScope::~GeneratorScope() { t_scoped_generator = prev_; }

void manual_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

namespace {

// Runs fill(host_tensor) on t itself when it lives on a CPU, or on a host staging tensor
// that is then copied to t's device.
template <typename Fill>
void fill_on_host(Tensor& t, const char* op, Fill&& fill) {
  KILN_CHECK(t.defined(), op, ": the tensor is undefined");
  KILN_CHECK(is_floating(t.dtype()), op, ": expected an f32 or f64 tensor, got ", t.str());
  if (t.device().is_cpu()) {
    fill(t);
  } else {
    Tensor host = Tensor::empty(t.shape(), t.dtype(), Device());
    fill(host);
    t.copy_(host);
  }
}

// out is (n): out[i] = lo + (hi - lo) * U_i, U_i = uniform01(philox_u32(seed, base, i)).
// The loop runs over counters (4 numbers each), as philox_u32 would read them, so each
// Philox call is made once, not four times.
template <typename T>
void uniform_cpu(T* out, int64_t n, double lo, double hi, uint64_t seed, uint64_t base) {
  const int64_t groups = (n + 3) / 4;
  const T top = static_cast<T>(hi), below_top = std::nextafter(top, static_cast<T>(lo));
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < groups; ++j) {
    const PhiloxOut r = philox4x32_10(seed, base + static_cast<uint64_t>(j));
    for (int64_t k = 0; k < 4 && 4 * j + k < n; ++k) {
      T v = static_cast<T>(lo + (hi - lo) * static_cast<double>(uniform01(r.v[k])));
      // Rounding to float can land exactly on hi; keep the interval half-open.
      out[4 * j + k] = (v < top || hi <= lo) ? v : below_top;
    }
  }
}

// out is (n): Box-Muller on pairs. Pair j uses numbers 2j and 2j+1 of the stream:
//   r = sqrt(-2 log(1 - u1)), z0 = r cos(2 pi u2), z1 = r sin(2 pi u2).
// 1 - u1 lies in (0, 1], so the log is finite.
template <typename T>
void normal_cpu(T* out, int64_t n, double mean, double stddev, uint64_t seed, uint64_t base) {
  const int64_t pairs = (n + 1) / 2;
  const double two_pi = 6.283185307179586476925286766559;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < pairs; ++j) {
    double u1 = uniform01(philox_u32(seed, base, static_cast<uint64_t>(2 * j)));
    double u2 = uniform01(philox_u32(seed, base, static_cast<uint64_t>(2 * j + 1)));
    double r = std::sqrt(-2.0 * std::log(1.0 - u1));
    out[2 * j] = static_cast<T>(mean + stddev * r * std::cos(two_pi * u2));
    if (2 * j + 1 < n) out[2 * j + 1] = static_cast<T>(mean + stddev * r * std::sin(two_pi * u2));
  }
}

}  // namespace

void uniform_(Tensor& t, double lo, double hi, Generator& gen) {
  KILN_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi,
             "uniform_: need finite lo <= hi, got [", lo, ", ", hi, ")");
  fill_on_host(t, "uniform_", [&](Tensor& h) {
    const int64_t n = h.numel();
    const Generator::Range range = gen.reserve_range(static_cast<uint64_t>(n));
    KILN_CHECK(range.device_offset == nullptr, "uniform_: the generator is inside a CUDA graph "
               "capture; initialise tensors before capturing");
    const uint64_t base = range.base;
    dispatch_floating(h.dtype(), "uniform_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      uniform_cpu<T>(h.data<T>(), n, lo, hi, range.seed, base);
    });
  });
}

void normal_(Tensor& t, double mean, double stddev, Generator& gen) {
  KILN_CHECK(std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0,
             "normal_: need a finite mean and std >= 0, got mean ", mean, ", std ", stddev);
  fill_on_host(t, "normal_", [&](Tensor& h) {
    const int64_t n = h.numel();
    const Generator::Range range = gen.reserve_range(static_cast<uint64_t>(2 * ((n + 1) / 2)));
    KILN_CHECK(range.device_offset == nullptr, "normal_: the generator is inside a CUDA graph "
               "capture; initialise tensors before capturing");
    const uint64_t base = range.base;
    dispatch_floating(h.dtype(), "normal_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      normal_cpu<T>(h.data<T>(), n, mean, stddev, range.seed, base);
    });
  });
}

void default_init_(Tensor& t, int64_t fan_in, Generator& gen) {
  KILN_CHECK(fan_in > 0, "default_init_: fan_in must be > 0, got ", fan_in, " for ", t.str());
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  uniform_(t, -bound, bound, gen);
}

}  // namespace kiln
