// parity_leaves.h: a row's inputs as fresh leaves on a device, for the suites of the parity
// table (parity_test.cpp, parity_split_test.cpp).
#pragma once

#include <cstddef>

#include "engine/tensor.h"
#include "parity/parity_cases.h"
#include "parity/parity_harness.h"

namespace kiln::parity {

inline bool is_float(const Tensor& t) {
  return t.defined() && (t.dtype() == DType::F32 || t.dtype() == DType::F64);
}

// Fresh leaves on `device` (inputs that require grad per the row); undefined stay undefined.
inline Inputs leaves(const Case& c, const Inputs& x, Device device, bool in_f64 = false) {
  Inputs out;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!x[i].defined()) {
      out.emplace_back();
      continue;
    }
    const Tensor v = in_f64 && is_float(x[i]) ? x[i].to(DType::F64) : x[i];
    out.push_back(testing::leaf_on(v, device, c.requires_grad(i) && is_float(v)));
  }
  return out;
}

inline bool any_grad(const Case& c, const Inputs& x) {
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].defined() && c.requires_grad(i) && is_float(x[i])) return true;
  return false;
}

}  // namespace kiln::parity
