// autograd.h: define-by-run reverse-mode differentiation.
//
// How it works (the same idea as PyTorch's engine, in ~200 lines):
//  1. An op whose inputs require grad creates a Node subclass that knows the op's backward,
//     stores what backward needs (Node::saved and its own members), and records one edge per
//     input: the input's grad_fn, or, for a leaf, the leaf's AccumulateGrad node.
//  2. backward(root, grad) walks the graph once to count, for each node, how many edges point
//     at it; then runs nodes in reverse creation order (a max-heap on the sequence number),
//     each only after all gradients flowing into it have been summed.
//  3. After a node ran, its saved tensors are released, so activation memory is freed while
//     backward proceeds. Running backward twice through the same graph is an error.
//  4. AccumulateGrad adds into the leaf's .grad, then calls the leaf's grad-ready hooks:
//     DataParallel uses them to start a bucket's allreduce while backward continues. A leaf
//     with a grad buffer (Tensor::set_grad_buffer) gets its gradient written into that buffer
//     in place; DataParallel uses it to make each .grad a view into its bucket.
// Grad mode is thread-local, so many threads can train independent graphs at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace kiln {

// How a node takes part in a split backward (backward_input_grads, below), when some of its
// inputs are weights (their gradients deferred) and others activations (needed now).
enum class SplitMode {
  // apply() computes the gradient of input i only when next[i] is set: the input half runs it
  // with the weight edges cut, the weight half runs it again with the other edges cut (it keeps
  // its saved tensors and the output gradient in between). Conv2d, matmul (Linear), bias add.
  ByEdges,
  // The weights' gradients fall out of the input gradient's computation (BatchNorm: d gamma and
  // d beta are the per-channel sums its input gradient needs anyway): the input half computes
  // everything, and only the accumulation into the weights waits.
  WeightsWithInput,
  // Cannot split: runs whole in the input half (WeightGradients::ran_whole() names it).
  Unsupported
};

struct Node {
  Node();
  virtual ~Node() = default;
  // grad_out has the shape of this node's output. Returns one gradient per input edge, in
  // the order of `next`; an undefined Tensor means "no gradient for that input".
  virtual std::vector<Tensor> apply(const Tensor& grad_out) = 0;
  virtual const char* name() const = 0;
  // Frees what backward needed. Nodes with extra members override and call the base.
  virtual void release_saved() { saved.clear(); released = true; }
  virtual SplitMode split_mode() const { return SplitMode::Unsupported; }

  std::vector<std::shared_ptr<Node>> next;  // one per input; null if the input needs no grad
  // The dtype of each input (set_history): the gradient returned for input i must have it
  // (a 16-bit activation's gradient is 16-bit), which backward() checks.
  std::vector<DType> input_dtypes;
  std::vector<Tensor> saved;                // tensors kept for backward
  uint64_t sequence_nr;                     // creation order: later nodes run first
  bool released = false;
};

// The sink for a leaf tensor's gradient.
struct AccumulateGrad : Node {
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf) : leaf(leaf) {}
  std::vector<Tensor> apply(const Tensor& grad_out) override;
  const char* name() const override { return "AccumulateGrad"; }
  void release_saved() override {}  // shared by every graph that uses the leaf: never released
  std::weak_ptr<TensorImpl> leaf;
};

// Thread-local switch: when disabled, ops record nothing.
struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Disables graph recording in this thread for its lifetime (evaluation, optimizer steps).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// True when grad mode is on and any of the inputs requires grad: the op must record a node.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// The node a gradient for `t` must flow to: its grad_fn, its leaf accumulator, or null.
std::shared_ptr<Node> gradient_edge(const Tensor& t);

// Connects `node` to `inputs` (node->next) and marks `output` as produced by it.
// Call only when any_requires_grad(...) was true.
void set_history(Tensor& output, const std::shared_ptr<Node>& node,
                 const std::vector<Tensor>& inputs);

// Runs the backward pass from `root` seeded with `grad` (same shape as root).
void backward(const Tensor& root, const Tensor& grad);

// ---- The backward pass in two halves (zero-bubble pipelines) ---------------------------------
// The weight-gradient half of a split backward: the work backward_input_grads() deferred, each
// item holding what it needs (the node's saved input, the output gradient it received). run()
// computes the weights' gradients and accumulates them into their .grad (the grad-ready hooks
// fire then). The two halves together equal backward() bit for bit.
class WeightGradients {
 public:
  WeightGradients();
  ~WeightGradients();
  WeightGradients(WeightGradients&&) noexcept;
  WeightGradients& operator=(WeightGradients&&) noexcept;

  void run();  // once; an error the second time
  bool pending() const;  // false once run, or when there was nothing to defer
  // How many nodes deferred their weight gradients, and the names of those that could not
  // split and ran whole in the input half (their gradients wait here, already computed).
  int deferred_nodes() const;
  const std::vector<std::string>& ran_whole() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
  friend WeightGradients backward_input_grads(const Tensor&, const Tensor&,
                                              const std::vector<Tensor>&);
};

// The input-gradient half B: the backward pass from `root` that computes the gradient of every
// activation and of the leaves in `inputs` (their .grad), and defers the gradients of every
// other leaf (the weights) to the returned WeightGradients (W). An undefined `grad` means ones
// (a one-element root, like Tensor::backward()).
//
// Which nodes are whose: a node is on the weights' side when every input of its op is a weight
// or computed from weights only (a weight's autocast copy, a transpose of it): all of its edges
// lead to weights'. Every other node is an activation's (even when, like the first
// convolution of a network, only its weight needs a gradient: it still runs in the input half,
// with nothing to compute there). An edge from an activation's node to a weights'-side node is
// deferred; the weight half runs those edges, then the weights'-side nodes, in the order
// backward() would (latest created first), so every sum is formed in the same order.
WeightGradients backward_input_grads(const Tensor& root, const Tensor& grad,
                                     const std::vector<Tensor>& inputs);

}  // namespace kiln
