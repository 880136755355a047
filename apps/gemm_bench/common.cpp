// common.cpp: what both devices' rows of gemm_bench use (rows.h).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "apps/gemm_bench/rows.h"

namespace kiln::apps::gemm_bench {

Tensor random_matrix(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n * n));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, {n, n});
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 0, worst = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(e <= worst)) worst = e;  // NaN sticks
  }
  return scale > 0 ? worst / scale : worst;
}

}  // namespace kiln::apps::gemm_bench
