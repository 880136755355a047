// flops.cpp: one counted forward of the model (models/flops.h).
#include "models/flops.h"

#include <cstdint>
#include <vector>

#include "engine/autograd.h"
#include "engine/device.h"
#include "engine/error.h"
#include "layers/flop_counter.h"

namespace kiln {

int64_t forward_flops(Module& model, const Shape& input_shape) {
  const std::vector<Tensor> params = model.parameters();
  KILN_CHECK(!params.empty(), "forward_flops: the model has no parameters to place the input by");
  const Device device = params.front().device();
  const bool was_training = model.is_training();
  model.eval();
  int64_t flops = 0;
  try {
    NoGradGuard no_grad;
    FlopCounter counter;
    model.forward(Tensor::zeros(input_shape, params.front().dtype(), device));
    flops = counter.flops();
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  return flops;
}

}  // namespace kiln
