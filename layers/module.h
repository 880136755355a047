// module.h: the base of every layer and model.
//
// A Module owns named parameters (trainable leaves), buffers (state that is saved but not
// trained, e.g. BatchNorm running statistics) and child modules. Names compose with dots, as
// in PyTorch, so state_dict keys look like "features.0.weight".
//
// Layers keep their parameters as Tensor members AND register them here; both handles share
// one TensorImpl, and to(device)/load_state_dict() replace the data in place (set_data), so
// the member, the registry and any optimizer that holds the parameter stay the same tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace kiln {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  virtual std::string type_name() const = 0;  // "Conv2d", used in printing and errors

  std::vector<Tensor> parameters() const;  // recursive, registration order
  NamedTensors named_parameters() const;
  NamedTensors named_buffers() const;
  std::map<std::string, Tensor> state_dict() const;  // parameters and buffers
  // Copies values into the existing tensors; a missing or extra key, or a shape mismatch, is
  // an error naming the key (strict).
  void load_state_dict(const std::map<std::string, Tensor>& state);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void to(Device device);  // moves parameters and buffers in place
  // The memory format this module and its children want their activations in (engine/tensor.h).
  // Channels-last: a model that reads it (ResNet) converts its input once, at the entry, and
  // its layers keep the format from there on. Every 4-D parameter (a convolution's weight) is
  // reordered into `format` in place (set_data, as to(Device)): the same tensor, so optimizers
  // keep seeing it, its gradients come back in that format, and cuDNN gets the filter in its
  // activations' format without a copy per step (docs/memory_format.md). Buffers are 1-D.
  void to(MemoryFormat format);
  MemoryFormat memory_format() const { return memory_format_; }
  void zero_grad();        // drops the .grad of every parameter
  int64_t num_parameters() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  std::string describe(int indent = 0) const;  // a tree, one module per line
  // The child registered as `name` (an error naming the known children if there is none).
  std::shared_ptr<Module> child(const std::string& name) const;
  // Drops the child `name`, and with it its parameters and buffers (a model transformed for
  // inference, e.g. BatchNorm folded into the convolution before it).
  void remove_module(const std::string& name);

 protected:
  // Registers and returns the tensor (the same handle): requires_grad is switched on.
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }
  virtual std::string extra_repr() const { return ""; }  // "1, 32, kernel_size=3"

 private:
  void collect(const std::string& prefix, bool params, NamedTensors& out) const;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  MemoryFormat memory_format_ = MemoryFormat::Contiguous;
};

// Runs children in order: y = m_n(...m_1(x)).
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> m);
  void push_back(const std::string& name, std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return children().size(); }
  std::shared_ptr<Module> at(size_t i) const { return children().at(i).second; }
};

}  // namespace kiln
