// train_checkpoint_test: the training checkpoint's record of the training set's size
// (apps/common/train_checkpoint.h): written and read back, and check_checkpoint_fits_dataset,
// which refuses to resume a mid-epoch checkpoint on a training set of another size (its
// position is a place in a permutation of the set it was written for) in words that say both
// sizes and what to do, while an epoch-end checkpoint fits any set.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "apps/common/train_checkpoint.h"
#include "engine/error.h"
#include "engine/optim/sgd.h"
#include "layers/linear.h"

namespace kiln::apps {
namespace {

// The message of the Input error check_checkpoint_fits_dataset throws; "" if none.
std::string fit_error(const TrainCheckpoint& c, int64_t train_examples) {
  try {
    check_checkpoint_fits_dataset(c, "run.ckpt", train_examples);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    return e.what();
  }
  return "";
}

TEST(TrainCheckpoint, MidEpochCheckpointFitsOnlyTheSetItWasWrittenFor) {
  TrainCheckpoint c;
  c.epoch = 2;
  c.epoch_position = 320;
  c.train_examples = 60000;
  EXPECT_EQ(fit_error(c, 60000), "");
  const std::string smaller = fit_error(c, 1000);
  EXPECT_NE(smaller.find("checkpoint 'run.ckpt': was written 320 images into epoch 3 over a "
                         "training set of 60000 images, and this one has 1000"),
            std::string::npos) << smaller;
  EXPECT_NE(smaller.find("resume it with the training set it was written for"), std::string::npos)
      << smaller;
  EXPECT_NE(fit_error(c, 60001), "");  // larger: the position is as meaningless
  // A file that does not record the size (an older Kiln's): refused only past the set's end.
  c.train_examples = -1;
  EXPECT_EQ(fit_error(c, 1000), "");
  const std::string past = fit_error(c, 100);
  EXPECT_NE(past.find("was written 320 images into epoch 3, past the 100 images of this "
                      "training set"), std::string::npos) << past;
  // At an epoch's end nothing depends on the set.
  c.epoch_position = 0;
  c.train_examples = 60000;
  EXPECT_EQ(fit_error(c, 1000), "");
}

TEST(TrainCheckpoint, TrainingSetSizeIsWrittenAndReadBack) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln_train_checkpoint_test_" + std::to_string(getpid()) + ".ckpt"))
                               .string();
  Linear model(3, 2);
  SGD opt(model.parameters(), 0.1);
  TrainCheckpoint meta;
  meta.model = "mlp";
  meta.optimizer = "sgd";
  meta.global_step = 5;
  meta.epoch_position = 40;
  meta.train_examples = 1234;
  write_train_checkpoint(path, model, opt, meta);
  EXPECT_EQ(read_train_checkpoint(path, "mlp", "sgd").train_examples, 1234);
  meta.train_examples = -1;  // not known to the writer: read back as not recorded
  write_train_checkpoint(path, model, opt, meta);
  EXPECT_EQ(read_train_checkpoint(path, "mlp", "sgd").train_examples, -1);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln::apps
