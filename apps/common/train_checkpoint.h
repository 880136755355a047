// train_checkpoint.h: what a training app saves (after each epoch, and every N optimizer steps
// inside one), and how it resumes.
//
// One Kiln checkpoint file (engine/serialize.h: magic, version, CRC per record, atomic write:
// a crash or a full disk leaves the previous checkpoint intact) holding:
//   tensors  "model.<state_dict key>"      the Module's parameters and buffers
//            "optimizer.<state_dict key>"  the Optimizer's state (lr, step, per-param buffers)
//            "scaler.<state_dict key>"     fp16 only: the GradScaler (scale, tracker, history)
//   meta     format   "kiln-train/2" ("kiln-train/1": the epoch-end files of older Kilns, read
//                     as position 0 with the step count derived from the epoch)
//            epoch    the 0-based epoch to continue; with epoch_position 0, the epochs completed
//            epoch_position  examples of that epoch's GLOBAL order already trained on, by all
//                     ranks together (data/sampler.h: a position means the same for any rank
//                     count, so a run may resume with more or fewer ranks); 0 at an epoch end
//            global_step     optimizer steps taken so far (skipped fp16 steps included): the t
//                     of the per-step learning-rate schedules
//            epoch_steps, epoch_loss_sum, epoch_seen   the epoch's training steps so far, and
//                     the sum of loss x batch size and the examples over them (all ranks): the
//                     epoch's reported training loss comes out as if it had not been cut
//            workers  data-parallel ranks that wrote it (informational)
//            train_examples  the training set's size: a mid-epoch position is a place in a
//                     permutation of that many examples, meaningless in a set of another size
//                     (check_checkpoint_fits_dataset); absent in older files
//            model, optimizer              names given on the command line ("cnn", "adadelta")
//            seed, generator_offset        the default Philox generator's state at that point
//            lr, test_accuracy             for people reading the file (informational; the
//                                          accuracy is the last evaluated epoch's)
//            history  the run's finished epochs, so that a resumed run reports all of them:
//                     "epoch,train_loss,test_loss,test_accuracy;..." (epoch 0-based, %.17g);
//                     absent in older files (an empty history)
//            history_seconds  each of those epochs' seconds (training + evaluation),
//                     "s0;s1;...": apart from `history` because it is the one entry a resumed
//                     run does not reproduce bit for bit (tools/kill_resume.sh and the tests
//                     compare the files without it)
//
// Why this is enough to resume bit for bit (same flags, same thread and rank counts), also in
// the middle of an epoch: the generator is counter based, so (seed, offset) is its whole state
// (initialisation and dropout draw from it; data-parallel rank r > 0 draws dropout from the key
// (seed, r) at the same offset, which every rank shares); samplers are pure functions of
// (seed, epoch), so the position within the epoch is the only thing they need besides; the
// loader's transforms are pure functions of (seed, epoch, index), so its workers carry no random
// state; the epoch-based learning-rate schedules are pure functions of the epoch and the
// per-step ones of global_step. Everything else is in the model, optimizer and scaler state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/optim/grad_scaler.h"
#include "engine/optim/optimizer.h"
#include "engine/serialize.h"
#include "layers/module.h"

namespace kiln::apps {

// One finished epoch of a run (the checkpoint's history).
struct EpochRecord {
  int64_t epoch = 0;  // 0-based
  double train_loss = 0, test_loss = 0, test_accuracy = 0;
  double seconds = 0;  // training + evaluation; of an epoch cut by a resume, the part after it
};

struct TrainCheckpoint {
  int64_t epoch = 0;           // the epoch to continue (epochs completed when epoch_position is 0)
  int64_t epoch_position = 0;  // global examples of `epoch` already trained on
  int64_t global_step = -1;    // optimizer steps so far; -1: not recorded (kiln-train/1)
  int64_t epoch_steps = 0;     // training steps of `epoch` so far
  double epoch_loss_sum = 0;   // sum of loss x batch size over them, all ranks
  int64_t epoch_seen = 0;      // examples over them, all ranks
  int64_t workers = 1;         // data-parallel ranks of the run that wrote it
  int64_t train_examples = -1;  // the training set's size; -1: not recorded (older files)
  std::string model;
  std::string optimizer;
  uint64_t seed = 0;
  uint64_t generator_offset = 0;
  double lr = 0;
  double test_accuracy = 0;
  std::vector<EpochRecord> history;  // the epochs finished before this point, in order
  Checkpoint file;  // the tensors, filled by read_train_checkpoint
};

// Writes model + optimizer state and `meta` (its `file` member is ignored) to `path`, and the
// loss scaler's state ("scaler.<key>") when training in fp16 (scaler not null). A failed write
// throws a Runtime error naming the file and the errno text; the previous file stays intact.
void write_train_checkpoint(const std::string& path, const Module& model, const Optimizer& opt,
                            const TrainCheckpoint& meta, const GradScaler* scaler = nullptr);

// Reads and validates `path` (kiln-train/1 or /2): a corrupt file, a file that is not a
// training checkpoint, or a model/optimizer name other than the expected ones is an Input
// error naming the file.
TrainCheckpoint read_train_checkpoint(const std::string& path, const std::string& expected_model,
                                      const std::string& expected_optimizer);

// A checkpoint written in the middle of an epoch holds a position in that epoch's order, a
// permutation of the training set it was written with: throws kiln::Error (Input) naming `path`
// when the training set now has `train_examples` images and the checkpoint was written for
// another number (or, in a file that does not record it, stands past them), saying what to do.
// A checkpoint at an epoch's end fits any set.
void check_checkpoint_fits_dataset(const TrainCheckpoint& ckpt, const std::string& path,
                                   int64_t train_examples);

// Loads the model and optimizer state from `ckpt` (strict: any missing, extra or misshapen
// entry is an Input error naming `path` and the entry) and restores the default generator.
// With a scaler (fp16), its state too; a checkpoint with scaler state and no scaler to take it,
// or the reverse, is an Input error saying which --precision the file was trained with.
void restore_train_checkpoint(const TrainCheckpoint& ckpt, const std::string& path,
                              Module& model, Optimizer& opt, GradScaler* scaler = nullptr);

}  // namespace kiln::apps
