// init.h: parameter initialisation, drawn from the Philox generator (reproducible per seed).
#pragma once

#include <cstdint>

#include "engine/philox.h"
#include "engine/tensor.h"

namespace kiln {

// Fills t (f32 or f64, any device) with U[lo, hi).
void uniform_(Tensor& t, double lo, double hi, Generator& gen = default_generator());
// Fills t with N(mean, std) (Box-Muller on Philox pairs).
void normal_(Tensor& t, double mean, double std, Generator& gen = default_generator());
// PyTorch's default for Linear and Conv weights and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
// (kaiming_uniform with a = sqrt(5) reduces to this bound).
void default_init_(Tensor& t, int64_t fan_in, Generator& gen = default_generator());

}  // namespace kiln
