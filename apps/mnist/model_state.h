// model_state.h: what a worker rank trains and saves: the model and optimizer the flags name,
// initialised from the seed or restored from --resume, written to --checkpoint after each epoch
// (apps/common/train_checkpoint.h holds the file format and why resuming is bit for bit).
#pragma once

#include <memory>
#include <vector>

#include "apps/common/train_checkpoint.h"
#include "apps/mnist/options.h"
#include "engine/device.h"
#include "engine/optim/optimizer.h"
#include "engine/tensor.h"
#include "layers/module.h"

namespace kiln::apps::mnist {

// adadelta | sgd (momentum 0.9) | adam at o.lr (already resolved from 0 to the default). The
// asynchronous parameter server's server ranks build theirs with it too: they apply the updates.
std::unique_ptr<Optimizer> make_optimizer(const Options& o, const std::vector<Tensor>& params);

struct ModelState {
  std::shared_ptr<Module> model;  // on the training device
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<GradScaler> scaler;  // --precision fp16: dynamic loss scaling; else null
  int start_epoch = 0;            // epochs already trained (from --resume), else 0
};

// Seeds the default generator with o.seed and builds the model on `device` (initialisation
// draws from the generator) and its optimizer; with --resume, loads both from `resumed`.
ModelState build_model_state(const Options& o, Device device, const TrainCheckpoint& resumed);

// Writes --checkpoint after epoch `epoch` (0-based) with the default generator's state.
void save_checkpoint(const Options& o, int epoch, const ModelState& s, double test_accuracy);

}  // namespace kiln::apps::mnist
