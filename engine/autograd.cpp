// autograd.cpp: the backward engine: graph traversal in dependency order, gradient accumulation, hooks.
#include "engine/autograd.h"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <queue>
#include <unordered_map>
#include <utility>

#include "engine/error.h"
#include "engine/ops.h"

namespace kiln {

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
thread_local bool t_grad_enabled = true;
}  // namespace

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1)) {}

bool GradMode::is_enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool enabled) { t_grad_enabled = enabled; }

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad_out) {
  auto impl = leaf.lock();
  if (!impl) return {};  // the leaf is gone; nothing to accumulate into
  Tensor t(impl);
  Tensor buffer = impl->grad_buffer;
  if (buffer.defined() && (!impl->grad.defined() || impl->grad.same(buffer))) {
    // The gradient lives in a buffer set by the leaf's owner (see Tensor::set_grad_buffer):
    // written in place, first by a copy, later ones added into it.
    if (impl->grad.defined()) {
      buffer.copy_(add(buffer, grad_out));
    } else {
      buffer.copy_(grad_out);
      impl->grad = buffer;
    }
  } else {
    // First gradient: own a private copy (grad_out may alias another tensor). Later ones add.
    impl->grad = impl->grad.defined() ? add(impl->grad, grad_out) : grad_out.clone();
  }
  for (auto& hook : impl->grad_ready_hooks) hook(impl->grad);
  return {};
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t && t->requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  if (!t.requires_grad()) return nullptr;
  if (t.grad_fn()) return t.grad_fn();
  TensorImpl* impl = t.impl();
  auto acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl->grad_accumulator = acc;
  }
  return acc;
}

void set_history(Tensor& output, const std::shared_ptr<Node>& node,
                 const std::vector<Tensor>& inputs) {
  node->next.clear();
  node->next.reserve(inputs.size());
  node->input_dtypes.clear();
  node->input_dtypes.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    node->next.push_back(gradient_edge(t));
    node->input_dtypes.push_back(t.defined() ? t.dtype() : DType::F32);
  }
  output.impl()->requires_grad = true;
  output.impl()->grad_fn = node;
}

void backward(const Tensor& root, const Tensor& grad) {
  KILN_CHECK(root.requires_grad(), "backward() on a tensor that does not require grad (",
             root.str(), "): no parameter or input with requires_grad led to it");
  check_same_shape(root, grad, "backward");
  NoGradGuard no_grad;  // gradients of gradients are not recorded
  std::shared_ptr<Node> root_node = gradient_edge(root);

  // 1. Count, for every reachable node, the edges that point at it.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack{root_node.get()};
  dependencies[root_node.get()] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& next : n->next) {
      if (!next) continue;
      auto [it, inserted] = dependencies.try_emplace(next.get(), 0);
      it->second++;
      if (inserted) stack.push_back(next.get());
    }
  }

  // 2. Run nodes whose inputs are complete, latest-created first.
  auto later_first = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
  std::unordered_map<Node*, Tensor> grads;
  grads[root_node.get()] = grad;
  ready.push(root_node.get());
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    // A node that received no gradient (all its consumers returned none) still runs its
    // bookkeeping so that the nodes after it see their dependency counts reach zero.
    std::vector<Tensor> grad_inputs;
    auto found = grads.find(node);
    if (found != grads.end()) {
      Tensor grad_out = std::move(found->second);
      grads.erase(found);
      KILN_CHECK(!node->released, "backward through ", node->name(),
                 " a second time: its saved tensors were freed by the first backward");
      grad_inputs = node->apply(grad_out);
    }
    node->release_saved();  // 3. free activations as we go
    for (size_t i = 0; i < node->next.size(); ++i) {
      Node* next = node->next[i].get();
      if (!next) continue;
      if (i < grad_inputs.size() && grad_inputs[i].defined()) {
        // A gradient has its tensor's dtype; two gradients of one tensor then add in it.
        KILN_CHECK(i >= node->input_dtypes.size() ||
                       grad_inputs[i].dtype() == node->input_dtypes[i],
                   node->name(), " returned a ", dtype_name(grad_inputs[i].dtype()),
                   " gradient for its ", dtype_name(node->input_dtypes[i]), " input ", i,
                   " (internal error)");
        Tensor& slot = grads[next];
        slot = slot.defined() ? add(slot, grad_inputs[i]) : grad_inputs[i];
      }
      if (--dependencies[next] == 0) ready.push(next);
    }
  }
}

// ---- Split backward ----------------------------------------------------------------------------

struct WeightGradients::State {
  bool ran = false;
  int deferred = 0;
  std::vector<std::string> whole;
};

WeightGradients::WeightGradients() : state_(std::make_unique<State>()) {}
WeightGradients::~WeightGradients() = default;
WeightGradients::WeightGradients(WeightGradients&&) noexcept = default;
WeightGradients& WeightGradients::operator=(WeightGradients&&) noexcept = default;

void WeightGradients::run() {
  KILN_CHECK(state_ && !state_->ran, "WeightGradients::run() a second time");
  state_->ran = true;
}
bool WeightGradients::pending() const { return state_ && !state_->ran && state_->deferred > 0; }
int WeightGradients::deferred_nodes() const { return state_ ? state_->deferred : 0; }
const std::vector<std::string>& WeightGradients::ran_whole() const { return state_->whole; }

WeightGradients backward_input_grads(const Tensor& root, const Tensor& grad,
                                     const std::vector<Tensor>& inputs) {
  (void)inputs;
  backward(root, grad);  // placeholder: the whole backward now, nothing deferred
  return WeightGradients();
}

}  // namespace kiln
