// module.cpp: Module: the parameter, buffer and child registries, state_dict, to(device); Sequential.
#include "layers/module.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "engine/autograd.h"
#include "engine/error.h"

namespace kiln {

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  KILN_CHECK(t.defined(), "parameter '", name, "' of ", type_name(), " is undefined");
  t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, t);
  return t;
}

void Module::collect(const std::string& prefix, bool params, NamedTensors& out) const {
  for (const auto& [name, t] : params ? params_ : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", params, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& t : parameters()) n += t.numel();
  return n;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : named_parameters()) out.emplace(name, t);
  for (auto& [name, t] : named_buffers()) out.emplace(name, t);
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto mine = state_dict();
  for (auto& [name, src] : state) {
    KILN_CHECK_INPUT(mine.count(name), "state dict has an unexpected entry '", name,
                     "': it was saved from a different model");
  }
  NoGradGuard no_grad;
  for (auto& [name, dst] : mine) {
    auto it = state.find(name);
    KILN_CHECK_INPUT(it != state.end(), "state dict is missing '", name,
                     "': it was saved from a different model");
    KILN_CHECK_INPUT(it->second.shape() == dst.shape(), "state dict entry '", name, "' has shape ",
                     shape_str(it->second.shape()), " but the model expects ",
                     shape_str(dst.shape()));
    Tensor d = dst;
    d.copy_(it->second);
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::to(MemoryFormat format) {
  memory_format_ = format;
  NoGradGuard no_grad;  // a reorder of the leaf's storage, not an op of the graph
  for (auto& [name, t] : params_)
    if (t.dim() == 4 && t.memory_format() != format) t.set_data(t.to(format));
  for (auto& [name, child] : children_) child->to(format);
}

void Module::to(Device device) {
  for (auto* list : {&params_, &buffers_})
    for (auto& [name, t] : *list)
      if (t.device() != device) t.set_data(t.to(device));
  for (auto& [name, child] : children_) child->to(device);
}

void Module::zero_grad() {
  for (auto& t : parameters()) t.set_grad(Tensor());
}

std::string Module::describe(int indent) const {
  std::ostringstream os;
  os << type_name() << "(" << extra_repr() << ")";
  for (auto& [name, child] : children_)
    os << "\n" << std::string(indent + 2, ' ') << name << ": " << child->describe(indent + 2);
  return os.str();
}

std::shared_ptr<Module> Module::child(const std::string& name) const {
  for (const auto& [n, m] : children_)
    if (n == name) return m;
  std::string known;
  for (const auto& [n, m] : children_) known += (known.empty() ? "" : ", ") + n;
  throw Error(detail::str(type_name(), " has no child '", name, "' (children: ", known, ")"));
}

void Module::remove_module(const std::string& name) {
  child(name);  // throws, naming the children, if there is none
  children_.erase(std::remove_if(children_.begin(), children_.end(),
                                 [&](const auto& entry) { return entry.first == name; }),
                  children_.end());
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<Module> m) {
  push_back(std::to_string(children().size()), std::move(m));
}

void Sequential::push_back(const std::string& name, std::shared_ptr<Module> m) {
  KILN_CHECK(m != nullptr, "Sequential::push_back: null module '", name, "'");
  register_module(name, std::move(m));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& [name, child] : children()) y = child->forward(y);
  return y;
}

}  // namespace kiln
