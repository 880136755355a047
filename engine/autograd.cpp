// autograd.cpp: the backward engine: graph traversal in dependency order, gradient accumulation, hooks.
#include "engine/autograd.h"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <queue>
#include <string>
#include <unordered_set>
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

namespace {

// Adds gradient `g` for input `i` of `node` into the slot of the node it flows to. A gradient
// has its tensor's dtype (checked); two gradients of one tensor then add in it.
void accumulate_into(std::unordered_map<Node*, Tensor>& grads, Node* node, size_t i,
                     Node* target, const Tensor& g) {
  KILN_CHECK(i >= node->input_dtypes.size() || g.dtype() == node->input_dtypes[i], node->name(),
             " returned a ", dtype_name(g.dtype()), " gradient for its ",
             dtype_name(node->input_dtypes[i]), " input ", i, " (internal error)");
  Tensor& slot = grads[target];
  slot = slot.defined() ? add(slot, g) : g;
}

auto later_first = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
using ReadyQueue = std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)>;

}  // namespace

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
  ReadyQueue ready(later_first);
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
      if (i < grad_inputs.size() && grad_inputs[i].defined())
        accumulate_into(grads, node, i, next, grad_inputs[i]);
      if (--dependencies[next] == 0) ready.push(next);
    }
  }
}

// ---- Split backward ----------------------------------------------------------------------------

namespace {

// Runs node->apply(grad_out) with the edges for which keep(i) is false cut (null), so that a
// SplitMode::ByEdges node computes only the others; the edges are put back after.
template <typename Keep>
std::vector<Tensor> apply_on_edges(Node* node, const Tensor& grad_out, Keep keep) {
  std::vector<std::shared_ptr<Node>> edges = node->next;
  for (size_t i = 0; i < node->next.size(); ++i)
    if (!keep(i)) node->next[i] = nullptr;
  std::vector<Tensor> grads;
  try {
    grads = node->apply(grad_out);
  } catch (...) {
    node->next = std::move(edges);
    throw;
  }
  node->next = std::move(edges);
  return grads;
}

}  // namespace

// One activation node whose weight edges were deferred.
struct DeferredNode {
  std::shared_ptr<Node> node;
  Tensor grad_out;               // ByEdges: the output gradient, for the second apply()
  std::vector<Tensor> computed;  // otherwise: the gradients apply() returned in the input half
  bool by_edges = false;
};

struct WeightGradients::State {
  bool ran = false;
  std::vector<DeferredNode> deferred;         // in the order the input half ran them
  std::unordered_set<Node*> weight_side;      // the weights' side of the graph
  std::vector<std::string> whole;
  std::pair<std::shared_ptr<Node>, Tensor> seed;  // a root on the weights' side, and its gradient
};

WeightGradients::WeightGradients() : state_(std::make_unique<State>()) {}
WeightGradients::~WeightGradients() = default;
WeightGradients::WeightGradients(WeightGradients&&) noexcept = default;
WeightGradients& WeightGradients::operator=(WeightGradients&&) noexcept = default;

bool WeightGradients::pending() const {
  return state_ && !state_->ran && (!state_->deferred.empty() || state_->seed.first);
}
int WeightGradients::deferred_nodes() const {
  return state_ ? static_cast<int>(state_->deferred.size()) : 0;
}
const std::vector<std::string>& WeightGradients::ran_whole() const { return state_->whole; }

void WeightGradients::run() {
  KILN_CHECK(state_ && !state_->ran, "WeightGradients::run() a second time: the weight half of a "
             "split backward runs once");
  state_->ran = true;
  NoGradGuard no_grad;
  State& st = *state_;
  auto on_weight_side = [&](Node* n) { return n && st.weight_side.count(n) > 0; };

  // Dependencies inside the weights' side: the deferred edges and the edges between its nodes.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, DeferredNode*> deferred_of;
  std::vector<Node*> stack;
  for (DeferredNode& d : st.deferred) {
    deferred_of[d.node.get()] = &d;
    for (auto& next : d.node->next) {
      if (!on_weight_side(next.get())) continue;
      if (dependencies[next.get()]++ == 0) stack.push_back(next.get());
    }
  }
  std::unordered_set<Node*> visited(stack.begin(), stack.end());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& next : n->next) {
      if (!next) continue;
      dependencies[next.get()]++;
      if (visited.insert(next.get()).second) stack.push_back(next.get());
    }
  }

  // The deferred nodes are ready at once; the weights'-side nodes when all their gradients are
  // in. One queue, latest created first, as in backward().
  ReadyQueue ready(later_first);
  for (DeferredNode& d : st.deferred) ready.push(d.node.get());
  std::unordered_map<Node*, Tensor> grads;
  if (st.seed.first) {
    Node* root = st.seed.first.get();
    grads[root] = st.seed.second;
    std::vector<Node*> from_root{root};
    while (!from_root.empty()) {  // the root's subgraph is all the weights' side
      Node* n = from_root.back();
      from_root.pop_back();
      for (auto& next : n->next) {
        if (!next) continue;
        if (dependencies[next.get()]++ == 0) from_root.push_back(next.get());
      }
    }
    ready.push(root);
  }
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grad_inputs;
    auto deferred = deferred_of.find(node);
    if (deferred != deferred_of.end()) {
      DeferredNode& d = *deferred->second;
      if (d.by_edges) {
        KILN_CHECK(!node->released, "the weight half through ", node->name(),
                   " after its saved tensors were freed (internal error)");
        grad_inputs = apply_on_edges(node, d.grad_out,
                                     [&](size_t i) { return on_weight_side(node->next[i].get()); });
        node->release_saved();
      } else {
        grad_inputs = std::move(d.computed);
      }
      d.grad_out = Tensor();
      for (size_t i = 0; i < node->next.size(); ++i) {
        Node* next = node->next[i].get();
        if (!on_weight_side(next)) continue;
        if (i < grad_inputs.size() && grad_inputs[i].defined())
          accumulate_into(grads, node, i, next, grad_inputs[i]);
        if (--dependencies[next] == 0) ready.push(next);
      }
      continue;
    }
    auto found = grads.find(node);
    if (found != grads.end()) {
      Tensor grad_out = std::move(found->second);
      grads.erase(found);
      grad_inputs = node->apply(grad_out);
    }
    node->release_saved();
    for (size_t i = 0; i < node->next.size(); ++i) {
      Node* next = node->next[i].get();
      if (!next) continue;
      if (i < grad_inputs.size() && grad_inputs[i].defined())
        accumulate_into(grads, node, i, next, grad_inputs[i]);
      if (--dependencies[next] == 0) ready.push(next);
    }
  }
  st.deferred.clear();
  st.weight_side.clear();
  st.seed = {};
}

WeightGradients backward_input_grads(const Tensor& root, const Tensor& grad_in,
                                     const std::vector<Tensor>& inputs) {
  KILN_CHECK(root.requires_grad(), "backward_input_grads() on a tensor that does not require "
             "grad (", root.str(), "): no parameter or input with requires_grad led to it");
  Tensor grad = grad_in;
  if (!grad.defined()) {
    KILN_CHECK(root.numel() == 1, "backward_input_grads() without a gradient needs a "
               "one-element root, got ", shape_str(root.shape()), ": pass the gradient");
    grad = Tensor::ones(root.shape(), root.dtype(), root.device());
  }
  check_same_shape(root, grad, "backward_input_grads");
  NoGradGuard no_grad;
  std::shared_ptr<Node> root_node = gradient_edge(root);

  // The accumulators of the inputs: activations' side, though they are leaves.
  std::unordered_set<Node*> input_sinks;
  for (const Tensor& t : inputs) {
    if (!t.requires_grad()) continue;
    KILN_CHECK(t.is_leaf(), "backward_input_grads(): input ", t.str(), " is not a leaf");
    input_sinks.insert(gradient_edge(t).get());
  }

  // 1. Every reachable node, and which side it is on (children before parents).
  WeightGradients result;
  WeightGradients::State& st = *result.state_;
  std::unordered_map<Node*, bool> side;  // true: the weights'
  std::vector<std::pair<Node*, size_t>> walk{{root_node.get(), 0}};
  side.reserve(64);
  std::unordered_set<Node*> entered{root_node.get()};
  while (!walk.empty()) {
    auto& [n, i] = walk.back();
    if (i < n->next.size()) {
      Node* child = n->next[i++].get();
      if (child && entered.insert(child).second) walk.push_back({child, 0});
      continue;
    }
    bool weights;
    if (dynamic_cast<AccumulateGrad*>(n)) {
      weights = input_sinks.count(n) == 0;
    } else {
      weights = !n->next.empty();
      for (auto& child : n->next) weights = weights && child && side.at(child.get());
    }
    side[n] = weights;
    if (weights) st.weight_side.insert(n);
    walk.pop_back();
  }
  auto on_weight_side = [&](Node* n) { return n && side.at(n); };

  // 2. The input half: backward() over the activations' side.
  // A root that depends on weights only (a weight penalty): all of it is the weight half's.
  if (on_weight_side(root_node.get())) st.seed = {root_node, grad};
  std::unordered_map<Node*, int> dependencies;
  for (auto& [n, weights] : side) {
    if (weights) continue;
    for (auto& next : n->next)
      if (next && !side.at(next.get())) dependencies[next.get()]++;
  }
  ReadyQueue ready(later_first);
  std::unordered_map<Node*, Tensor> grads;
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;  // keeps deferred nodes alive
  if (!on_weight_side(root_node.get())) {
    grads[root_node.get()] = grad;
    ready.push(root_node.get());
  }
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    bool has_deferred = false;
    for (auto& next : node->next) has_deferred = has_deferred || on_weight_side(next.get());
    std::vector<Tensor> grad_inputs;
    auto found = grads.find(node);
    Tensor grad_out;
    if (found != grads.end()) {
      grad_out = std::move(found->second);
      grads.erase(found);
      KILN_CHECK(!node->released, "backward through ", node->name(),
                 " a second time: its saved tensors were freed by the first backward");
    }
    if (grad_out.defined() && has_deferred) {
      const SplitMode mode = node->split_mode();
      DeferredNode d;  // holds the node: the caller may drop the graph before the weight half
      d.node = node == root_node.get() ? root_node : owners.at(node);
      if (mode == SplitMode::ByEdges) {
        // Nothing to compute now when every gradient is a weight's (a first layer, whose
        // input needs none): the whole node waits for the weight half.
        bool needs_input = false;
        for (auto& next : node->next) needs_input = needs_input || (next && !side.at(next.get()));
        if (needs_input)
          grad_inputs = apply_on_edges(
              node, grad_out, [&](size_t i) { return !on_weight_side(node->next[i].get()); });
        d.grad_out = grad_out;
        d.by_edges = true;
      } else {
        grad_inputs = node->apply(grad_out);
        d.computed.resize(node->next.size());
        for (size_t i = 0; i < node->next.size() && i < grad_inputs.size(); ++i)
          if (on_weight_side(node->next[i].get())) d.computed[i] = grad_inputs[i];
        if (mode == SplitMode::Unsupported) st.whole.push_back(node->name());
        node->release_saved();
      }
      st.deferred.push_back(std::move(d));
    } else {
      if (grad_out.defined()) grad_inputs = node->apply(grad_out);
      node->release_saved();
    }
    for (size_t i = 0; i < node->next.size(); ++i) {
      const std::shared_ptr<Node>& next = node->next[i];
      if (!next || side.at(next.get())) continue;
      owners.emplace(next.get(), next);
      if (i < grad_inputs.size() && grad_inputs[i].defined())
        accumulate_into(grads, node, i, next.get(), grad_inputs[i]);
      if (--dependencies[next.get()] == 0) ready.push(next.get());
    }
  }
  return result;
}

}  // namespace kiln
