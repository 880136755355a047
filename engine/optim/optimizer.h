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
//    data pointers with an OpenMP loop templated on float/double (a fused kernel on CUDA;
//    when every stepped parameter is on one CUDA device with one dtype, SGD and Adam step them
//    all in one launch, engine/optim/multi_tensor.h).
//  - what changes from step to step lives in memory of the parameters' device, and the
//    kernels read it when they run: the learning rate (set_lr() writes it there with a kernel,
//    no wait), the step counts (advanced there), the bias corrections (computed there from
//    them), and step(skip)'s flag. Queueing a step never waits for the device, and a step
//    captured into a CUDA graph replays with the current values (optim_kernels.h).
//  - the per-element rule is a small KILN_HOST_DEVICE inline function in the subclass's
//    header, so the fused CUDA kernel (engine/optim/optim_kernels.h) calls the very same code.
//  - state_dict() keys: "lr", "step" (f64 / i64, shape [1]), and for parameter i:
//    "param.<i>.step" and "param.<i>.<buffer>". Round-tripping it continues identically.
//    state_dict() reads the step counts from the device (a named wait, outside the step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/host_device.h"
#include "engine/tensor.h"

namespace kiln {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  void step();
  // The step, unless skip_if_nonzero (one int32 value in memory of the parameters' device,
  // such as GradScaler::found_inf()) is nonzero when the step's kernels run: then parameters,
  // buffers and step counts stay as they were, as if step() had not been called. The flag is
  // read by the kernels, not by the host: nothing waits.
  void step(const Tensor& skip_if_nonzero);
  virtual const char* name() const = 0;  // "SGD", used in errors
  // The per-parameter buffers this optimizer keeps, e.g. {"exp_avg", "exp_avg_sq"}.
  virtual std::vector<std::string> buffer_names() const = 0;
  void zero_grad();                      // drops every parameter's .grad (PyTorch set_to_none)

  // Whether step() may update all CUDA parameters in one launch (update_all; on by default).
  // Off, each parameter is stepped by its own kernels: the results are the same bit for bit,
  // with more launches (PyTorch's foreach=False).
  void set_multi_tensor(bool on) { multi_tensor_ = on; }
  bool multi_tensor() const { return multi_tensor_; }

  double lr() const { return lr_; }
  void set_lr(double lr);  // also writes the copy on each device, without waiting
  // Steps taken (not skipped). Read from the device: waits for it (named, cuda::AllowSync).
  int64_t step_count() const;
  const std::vector<Tensor>& params() const { return params_; }

  virtual std::map<std::string, Tensor> state_dict() const;
  // Strict: a key that does not belong to this optimizer, a buffer whose shape differs from
  // its parameter's, or a parameter index out of range is an Input error naming the key.
  virtual void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  struct ParamState {
    Tensor step;                            // i64 [1] on the parameter's device: its updates
    Tensor coefs;                           // f64 scratch of the *_prepare kernels
    std::map<std::string, Tensor> buffers;  // the parameter's shape, dtype, device, format
  };
  // Updates parameter i, whose gradient g is defined; skip is null or a device flag (see
  // step(skip)). The subclass's rule.
  virtual void update(size_t i, const Tensor& g, const int32_t* skip) = 0;
  // Updates parameters indices[k] with gradients grads[k], all on one CUDA device and of one
  // dtype, in one step's worth of launches for all of them (engine/optim/multi_tensor.h), with
  // the results of update() bit for bit. False when the optimizer has no such path: step() then
  // calls update() for each.
  virtual bool update_all(const std::vector<size_t>& /*indices*/,
                          const std::vector<Tensor>& /*grads*/, const int32_t* /*skip*/) {
    return false;
  }
  // The parameter's buffer `name`, created as zeros on first use. `created` tells the caller
  // it is fresh. (SGD's first momentum step is decided on the device, by the step count.)
  Tensor& buffer(size_t i, const std::string& name, bool* created = nullptr);
  // The gradient of parameter i, checked against the parameter; undefined if it has none.
  Tensor grad_of(size_t i) const;
  // Parameter i's step count (i64, on its device), created as 0 on first use.
  int64_t* step_of(size_t i);
  // Parameter i's scratch of n doubles on its device, for the *_prepare kernels.
  Tensor coefficients(size_t i, int64_t n);
  // The learning rate in memory of `device` (f64 [1]), created on first use.
  const double* lr_on(Device device);

  std::vector<Tensor> params_;
  std::vector<ParamState> state_;
  double lr_;

 private:
  std::vector<Tensor> lr_copies_;  // one f64 [1] per device the parameters were stepped on
  Tensor step_count_;              // i64 [1], on the first parameter's device
  bool multi_tensor_ = true;
};

}  // namespace kiln
