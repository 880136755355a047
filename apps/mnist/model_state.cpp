// model_state.cpp: see model_state.h.
#include "apps/mnist/model_state.h"

#include "engine/cuda/sync_debug.h"
#include "engine/tensor.h"
#include "engine/optim/adadelta.h"
#include "engine/optim/adam.h"
#include "engine/optim/sgd.h"
#include "engine/philox.h"
#include "models/mlp.h"
#include "models/mnist_cnn.h"
#include "models/resnet.h"

namespace kiln::apps::mnist {

std::unique_ptr<Optimizer> make_optimizer(const Options& o, const std::vector<Tensor>& params) {
  if (o.optimizer == "sgd") return std::make_unique<SGD>(params, o.lr, /*momentum=*/0.9);
  if (o.optimizer == "adam") return std::make_unique<Adam>(params, o.lr);
  return std::make_unique<Adadelta>(params, o.lr);
}

namespace {

// --model: the MNIST CNN, the MLP, or torchvision's ResNet-18 with a 1-channel stem.
std::shared_ptr<Module> make_model(const Options& o) {
  if (o.model == "resnet18") {
    ResNetConfig config = resnet_config("resnet18", /*num_classes=*/10);
    config.in_channels = 1;
    return make_resnet(config);
  }
  if (o.model == "mlp") return make_mlp();
  return make_mnist_cnn();
}

}  // namespace

ModelState build_model_state(const Options& o, Device device, const TrainCheckpoint& resumed) {
  // Initialised on the host, uploaded once (and a checkpoint read once).
  cuda::AllowSync allow("mnist_train setup: the model is uploaded, a checkpoint restored");
  ModelState s;
  manual_seed(o.seed);  // before the model: initialisation draws from the generator
  s.model = make_model(o);
  s.model->to(device);
  // Before the optimizer, which keeps the parameters as they are from here.
  if (o.memory_format == "channels_last") s.model->to(MemoryFormat::ChannelsLast);
  s.opt = make_optimizer(o, s.model->parameters());
  if (o.precision == "fp16") s.scaler = std::make_unique<GradScaler>();
  if (!o.resume.empty()) {
    restore_train_checkpoint(resumed, o.resume, *s.model, *s.opt, s.scaler.get());
    s.start_epoch = static_cast<int>(resumed.epoch);
    s.start_progress.position = resumed.epoch_position;
    s.start_progress.steps = resumed.epoch_steps;
    s.start_progress.loss_sum = resumed.epoch_loss_sum;
    s.start_progress.seen = resumed.epoch_seen;
    s.start_step = resumed.global_step;
  }
  return s;
}

void save_checkpoint(const Options& o, const SavePoint& at, const ModelState& s) {
  cuda::AllowSync allow("mnist_train: a checkpoint copies the model and optimizer to the host");
  TrainCheckpoint meta;
  meta.train_examples = at.train_examples;
  meta.epoch = at.epoch;
  meta.epoch_position = at.progress.position;
  meta.global_step = at.global_step;
  meta.epoch_steps = at.progress.steps;
  meta.epoch_loss_sum = at.progress.loss_sum;
  meta.epoch_seen = at.progress.seen;
  meta.workers = at.workers;
  meta.model = o.model;
  meta.optimizer = o.optimizer;
  meta.seed = o.seed;
  meta.generator_offset = default_generator().offset();
  meta.lr = s.opt->lr();
  meta.test_accuracy = at.test_accuracy;
  meta.history = at.history;
  write_train_checkpoint(o.checkpoint, *s.model, *s.opt, meta, s.scaler.get());
}

}  // namespace kiln::apps::mnist
