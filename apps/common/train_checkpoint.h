// train_checkpoint.h: what a training app saves after each epoch, and how it resumes.
//
// One Kiln checkpoint file (engine/serialize.h: magic, version, CRC per record, atomic write)
// holding:
//   tensors  "model.<state_dict key>"      the Module's parameters and buffers
//            "optimizer.<state_dict key>"  the Optimizer's state (lr, step, per-param buffers)
//   meta     format   "kiln-train/1"
//            epoch    epochs completed (the next run starts at this 0-based epoch)
//            model, optimizer              names given on the command line ("cnn", "adadelta")
//            seed, generator_offset        the default Philox generator's state after the epoch
//            lr, test_accuracy             for people reading the file (informational)
//
// Why this is enough to resume bit for bit: the generator is counter based, so (seed, offset)
// is its whole state; samplers are pure functions of (seed, epoch); LR schedules are pure
// functions of the epoch. Everything else is in the model and optimizer state.
#pragma once

#include <cstdint>
#include <string>

#include "engine/optim/grad_scaler.h"
#include "engine/optim/optimizer.h"
#include "engine/serialize.h"
#include "layers/module.h"

namespace kiln::apps {

struct TrainCheckpoint {
  int64_t epoch = 0;  // epochs completed
  std::string model;
  std::string optimizer;
  uint64_t seed = 0;
  uint64_t generator_offset = 0;
  double lr = 0;
  double test_accuracy = 0;
  Checkpoint file;  // the tensors, filled by read_train_checkpoint
};

// Writes model + optimizer state and `meta` (its `file` member is ignored) to `path`, and the
// loss scaler's state ("scaler.<key>") when training in fp16 (scaler not null).
void write_train_checkpoint(const std::string& path, const Module& model, const Optimizer& opt,
                            const TrainCheckpoint& meta, const GradScaler* scaler = nullptr);

// Reads and validates `path`: a corrupt file, a file that is not a training checkpoint, or a
// model/optimizer name other than the expected ones is an Input error naming the file.
TrainCheckpoint read_train_checkpoint(const std::string& path, const std::string& expected_model,
                                      const std::string& expected_optimizer);

// Loads the model and optimizer state from `ckpt` (strict: any missing, extra or misshapen
// entry is an Input error naming `path` and the entry) and restores the default generator.
// With a scaler (fp16), its state too; a checkpoint with scaler state and no scaler to take it,
// or the reverse, is an Input error saying which --precision the file was trained with.
void restore_train_checkpoint(const TrainCheckpoint& ckpt, const std::string& path,
                              Module& model, Optimizer& opt, GradScaler* scaler = nullptr);

}  // namespace kiln::apps
