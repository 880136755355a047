// optimizer.cpp: parameter bookkeeping, the step loop, the per-step values kept on the
// parameters' device (learning rate, step counts), zero_grad, state_dict save/load shared by
// all optimizers. The update rules live in sgd.cpp, adam.cpp, adadelta.cpp.
#include "engine/optim/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/cuda/sync_debug.h"
#include "engine/dispatch.h"
#include "engine/error.h"
#include "engine/optim/optim_kernels.h"

namespace kiln {

namespace cpu {

void count_step(Backend, int64_t* count, const int32_t* skip) {
  if (!skip || *skip == 0) ++*count;
}

}  // namespace cpu

namespace {

// t on `device`: t itself, or a copy when the parameters moved since it was made.
Tensor& on(Tensor& t, Device device) {
  if (t.device() != device) t = t.to(device);
  return t;
}

// The one value of an i64 [1] tensor, read from wherever it lives.
int64_t read_count(const Tensor& t) {
  if (!t.defined()) return 0;
  cuda::AllowSync allow("Optimizer: a step count read from the device (outside the step)");
  return static_cast<int64_t>(t.item());
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double lr)
    : params_(std::move(params)), state_(params_.size()), lr_(lr) {
  KILN_CHECK_INPUT(std::isfinite(lr) && lr >= 0, "optimizer: learning rate must be >= 0, got ", lr);
  for (size_t i = 0; i < params_.size(); ++i) {
    KILN_CHECK(params_[i].defined(), "optimizer: parameter ", i, " is undefined");
    KILN_CHECK(is_floating(params_[i].dtype()), "optimizer: parameter ", i,
               " must be f32 or f64, got ", params_[i].str());
    for (size_t j = 0; j < i; ++j)
      KILN_CHECK(!params_[i].same(params_[j]), "optimizer: parameter ", i,
                 " is the same tensor as parameter ", j, ": pass each parameter once");
  }
}

void Optimizer::set_lr(double lr) {
  KILN_CHECK_INPUT(std::isfinite(lr) && lr >= 0, name(), ": learning rate must be >= 0, got ", lr);
  lr_ = lr;
  for (Tensor& copy : lr_copies_) copy.fill_(lr);  // a fill kernel on CUDA: queued, no wait
}

const double* Optimizer::lr_on(Device device) {
  for (Tensor& copy : lr_copies_)
    if (copy.device() == device) return copy.data<double>();
  lr_copies_.push_back(Tensor::full({1}, lr_, DType::F64, device));
  return lr_copies_.back().data<double>();
}

int64_t* Optimizer::step_of(size_t i) {
  Tensor& t = state_[i].step;
  if (!t.defined()) t = Tensor::zeros({1}, DType::I64, params_[i].device());
  return on(t, params_[i].device()).data<int64_t>();
}

Tensor Optimizer::coefficients(size_t i, int64_t n) {
  Tensor& t = state_[i].coefs;
  if (!t.defined() || t.numel() != n || t.device() != params_[i].device())
    t = Tensor::empty({n}, DType::F64, params_[i].device());
  return t;
}

int64_t Optimizer::step_count() const { return read_count(step_count_); }

void Optimizer::step() { step(Tensor()); }

void Optimizer::step(const Tensor& skip_if_nonzero) {
  NoGradGuard no_grad;
  const Device home = params_.empty() ? Device() : params_[0].device();
  const int32_t* skip = nullptr;
  if (skip_if_nonzero.defined()) {
    KILN_CHECK(skip_if_nonzero.dtype() == DType::I32 && skip_if_nonzero.numel() == 1, name(),
               ": the skip flag must be one i32 value, got ", skip_if_nonzero.str());
    KILN_CHECK(skip_if_nonzero.device() == home, name(), ": the skip flag is on ",
               skip_if_nonzero.device().str(), " but the parameters are on ", home.str());
    skip = skip_if_nonzero.data<int32_t>();
  }
  std::vector<size_t> indices;
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = grad_of(i);
    if (!g.defined()) continue;
    KILN_CHECK(!skip || params_[i].device() == home, name(), ": parameter ", i, " is on ",
               params_[i].device().str(), ", not on ", home.str(),
               " with the skip flag: step(skip) needs every parameter on the flag's device");
    indices.push_back(i);
    grads.push_back(std::move(g));
  }
  // One device and dtype for all of them on CUDA: the whole step in few launches, if the
  // optimizer has that path. Otherwise (the CPU, mixed devices or dtypes) one by one.
  const bool uniform =
      !indices.empty() && params_[indices[0]].device().type == DeviceType::CUDA &&
      std::all_of(indices.begin(), indices.end(), [&](size_t i) {
        return params_[i].device() == params_[indices[0]].device() &&
               params_[i].dtype() == params_[indices[0]].dtype();
      });
  if (!multi_tensor_ || !uniform || !update_all(indices, grads, skip))
    for (size_t k = 0; k < indices.size(); ++k) update(indices[k], grads[k], skip);
  if (!step_count_.defined()) step_count_ = Tensor::zeros({1}, DType::I64, home);
  int64_t* count = on(step_count_, home).data<int64_t>();
  on_device(name(), home, [&](auto backend) { count_step(backend, count, skip); });
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.set_grad(Tensor());
}

Tensor Optimizer::grad_of(size_t i) const {
  const Tensor& p = params_[i];
  Tensor g = p.grad();
  if (!g.defined()) return g;
  KILN_CHECK(g.shape() == p.shape(), name(), ": parameter ", i, " ", shape_str(p.shape()),
             " has a gradient of shape ", shape_str(g.shape()));
  KILN_CHECK(g.dtype() == p.dtype() && g.device() == p.device(), name(), ": parameter ", i, " (",
             p.str(), ") has a gradient of another dtype or device: ", g.str());
  // The kernels walk parameter and gradient in storage order: one format for both. Backward
  // gives a parameter's gradient its format; one set otherwise is reordered (counted).
  if (g.memory_format() != p.memory_format()) g = g.to(p.memory_format());
  return g;
}

Tensor& Optimizer::buffer(size_t i, const std::string& buf_name, bool* created) {
  auto& bufs = state_[i].buffers;
  auto it = bufs.find(buf_name);
  if (created) *created = (it == bufs.end());
  const Tensor& p = params_[i];
  if (it == bufs.end()) {
    // In the parameter's memory format: the update rules are element-wise over the bytes of
    // parameter, gradient and buffers, which must therefore lie in one order.
    Tensor zeros = Tensor::empty(p.shape(), p.dtype(), p.device(), p.memory_format());
    zeros.zero_();
    it = bufs.emplace(buf_name, zeros).first;
  } else if (it->second.memory_format() != p.memory_format()) {
    // The parameter was reordered since (Module::to(MemoryFormat)), as `on` follows a move.
    it->second = it->second.to(p.memory_format());
  }
  return it->second;
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> out;
  out["lr"] = Tensor::from_vector(std::vector<double>{lr_}, {1});
  out["step"] = Tensor::from_vector(std::vector<int64_t>{step_count()}, {1});
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string prefix = "param." + std::to_string(i) + ".";
    out[prefix + "step"] =
        Tensor::from_vector(std::vector<int64_t>{read_count(state_[i].step)}, {1});
    // In logical (contiguous) order whatever the parameter's format, so that a file does not
    // depend on it: a copy either way.
    for (const auto& [buf_name, t] : state_[i].buffers)
      out[prefix + buf_name] = t.is_channels_last() ? t.contiguous() : t.clone();
  }
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  NoGradGuard no_grad;
  auto scalar = [&](const std::string& key) -> const Tensor& {
    auto it = state.find(key);
    KILN_CHECK_INPUT(it != state.end(), name(), " state is missing '", key, "'");
    KILN_CHECK_INPUT(it->second.numel() == 1, name(), " state entry '", key,
                     "' must hold one value, has shape ", shape_str(it->second.shape()));
    return it->second;
  };
  const double lr = scalar("lr").item();
  const int64_t steps = static_cast<int64_t>(scalar("step").item());
  const std::vector<std::string> known = buffer_names();

  std::vector<ParamState> fresh(params_.size());
  for (const auto& [key, t] : state) {
    if (key == "lr" || key == "step") continue;
    // "param.<i>.<name>"
    size_t dot = key.find('.', 6);
    KILN_CHECK_INPUT(key.rfind("param.", 0) == 0 && dot != std::string::npos && dot > 6, name(),
                     " state has an unexpected entry '", key, "'");
    const std::string index_str = key.substr(6, dot - 6);
    const std::string field = key.substr(dot + 1);
    KILN_CHECK_INPUT(index_str.size() <= 9 &&
                         std::all_of(index_str.begin(), index_str.end(),
                                     [](unsigned char ch) { return std::isdigit(ch) != 0; }),
                     name(),
                     " state has an unexpected entry '", key, "'");
    const size_t i = std::stoul(index_str);
    KILN_CHECK_INPUT(i < params_.size(), name(), " state entry '", key, "' is for parameter ", i,
                     " but this optimizer has ", params_.size(),
                     " parameters: it was saved for a different model");
    if (field == "step") {
      KILN_CHECK_INPUT(t.numel() == 1, name(), " state entry '", key, "' must hold one value");
      // A fill kernel on CUDA (no wait); a count is exact in the double fill_ takes.
      fresh[i].step = Tensor::full({1}, t.item(), DType::I64, params_[i].device());
      continue;
    }
    KILN_CHECK_INPUT(std::find(known.begin(), known.end(), field) != known.end(), name(),
                     " state has an unexpected entry '", key, "': it was saved by another optimizer");
    const Tensor& p = params_[i];
    KILN_CHECK_INPUT(t.shape() == p.shape(), name(), " state entry '", key, "' has shape ",
                     shape_str(t.shape()), " but parameter ", i, " has shape ", shape_str(p.shape()));
    Tensor b = Tensor::empty(p.shape(), p.dtype(), p.device(), p.memory_format());
    b.copy_(t);  // saved in logical order: reordered into the parameter's format
    fresh[i].buffers[field] = b;
  }
  set_lr(lr);
  step_count_ = Tensor::full({1}, static_cast<double>(steps), DType::I64,
                             params_.empty() ? Device() : params_[0].device());
  state_ = std::move(fresh);
}

}  // namespace kiln
