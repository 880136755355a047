// optimizer.h: the base of every optimizer (SGD, Adam/AdamW, Adadelta).
//
// An optimizer holds the parameters it updates (the same TensorImpls as the model's, so
// Module::to() and load_state_dict() never leave it pointing at stale tensors), the learning
// rate, a global step counter, and per-parameter state: named buffers that live on the
// parameter's device ("momentum_buffer", "exp_avg", ...) and the number of updates that
// parameter received (Adam's bias correction needs it per parameter, as in PyTorch).
//
// Conventions shared by every subclass:
//  - step() runs under NoGradGuard, skips parameters whose .grad is undefined (they get no
//    state and their per-parameter step does not advance), and updates in place through raw
//    data pointers with an OpenMP loop templated on float/double.
//  - the per-element rule is a small KILN_HOST_DEVICE inline function in the subclass's
//    header, so the fused CUDA kernel (engine/optim/optim_kernels.h) calls the very same code.
//  - state_dict() keys: "lr", "step" (f64 / i64, shape [1]), and for parameter i:
//    "param.<i>.step" and "param.<i>.<buffer>". Round-tripping it continues identically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/host_device.h"
#include "engine/tensor.h"

namespace kiln {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  virtual const char* name() const = 0;  // "SGD", used in errors
  // The per-parameter buffers this optimizer keeps, e.g. {"exp_avg", "exp_avg_sq"}.
  virtual std::vector<std::string> buffer_names() const = 0;
  void zero_grad();                      // drops every parameter's .grad (PyTorch set_to_none)

  double lr() const { return lr_; }
  void set_lr(double lr);
  int64_t step_count() const { return step_count_; }
  const std::vector<Tensor>& params() const { return params_; }

  virtual std::map<std::string, Tensor> state_dict() const;
  // Strict: a key that does not belong to this optimizer, a buffer whose shape differs from
  // its parameter's, or a parameter index out of range is an Input error naming the key.
  virtual void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  struct ParamState {
    int64_t step = 0;                       // updates this parameter received
    std::map<std::string, Tensor> buffers;  // same shape, dtype and device as the parameter
  };
  // The parameter's buffer `name`, created as zeros on first use. `created` tells the caller
  // it is fresh (SGD initialises its momentum buffer from the gradient then).
  Tensor& buffer(size_t i, const std::string& name, bool* created = nullptr);
  // The gradient of parameter i, checked against the parameter; undefined if it has none.
  Tensor grad_of(size_t i) const;

  std::vector<Tensor> params_;
  std::vector<ParamState> state_;
  double lr_;
  int64_t step_count_ = 0;
};

}  // namespace kiln
