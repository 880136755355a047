// model_state.h: what a worker rank trains and saves: the model and optimizer the flags name,
// initialised from the seed or restored from --resume, written to --checkpoint after each epoch
// and every --checkpoint-every optimizer steps (apps/common/train_checkpoint.h holds the file
// format and why resuming is bit for bit).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "apps/common/train_checkpoint.h"
#include "apps/mnist/options.h"
#include "apps/mnist/train_loop.h"
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
  int start_epoch = 0;            // the epoch to start (from --resume), else 0
  EpochProgress start_progress;   // where in it (a mid-epoch checkpoint), else its beginning
  int64_t start_step = -1;        // optimizer steps already taken; -1: from the epoch (old files)
};

// Seeds the default generator with o.seed and builds the model on `device` (initialisation
// draws from the generator) and its optimizer; with --resume, loads both from `resumed`.
ModelState build_model_state(const Options& o, Device device, const TrainCheckpoint& resumed);

// What a checkpoint records besides the model, optimizer and generator state.
struct SavePoint {
  int64_t train_examples = -1;  // the training set's size (a mid-epoch position needs it)
  int epoch = 0;                // the epoch to continue from (0-based)
  EpochProgress progress;       // where in it, sums over all ranks (zeros: at its start)
  int64_t global_step = 0;      // optimizer steps taken
  int workers = 1;              // data-parallel ranks
  double test_accuracy = 0;     // the last evaluated epoch's (informational)
  std::vector<EpochRecord> history;  // the run's finished epochs, resumed ones included
};

// Writes --checkpoint with the default generator's state: after an epoch, `at` is the next
// epoch with zero progress; mid-epoch, the epoch and its progress.
void save_checkpoint(const Options& o, const SavePoint& at, const ModelState& s);

}  // namespace kiln::apps::mnist
