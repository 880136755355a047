// rank_settings.h: what the ranks of a data-parallel mnist_train must share, as the settings
// comm::check_ranks_agree compares (comm/agreement.h) before the first broadcast. Apart from
// dist_flags.h, which reads the flags alone (and is fuzzed alone), because these need the
// model and the data sets.
#pragma once

#include <vector>

#include "apps/common/train_checkpoint.h"
#include "apps/mnist/options.h"
#include "comm/agreement.h"
#include "data/dataset.h"
#include "layers/module.h"

namespace kiln::apps::mnist {

// What every rank of a run must share (comm/agreement.h), as the flags' final values: after
// --recipe, the optimizer's default --lr and the seed a --resume checkpoint gives. Flags that
// may differ per host (--device, --threads, --workers, --data, output paths) are left out; the
// data a rank reads is compared by its size instead (worker_settings).
std::vector<comm::Setting> flags_every_rank_shares(const Options& o,
                                                   const apps::TrainCheckpoint& resumed);

// What the worker ranks must also share once their model and data exist: the model's
// parameters (count and shapes: another build of Kiln could define another model) and the
// sizes of the training and test sets (ranks that shard sets of other sizes take other
// numbers of steps, and the ranks with more steps would wait forever).
std::vector<comm::Setting> worker_settings(const Module& model, const Dataset& train,
                                           const Dataset& test);

}  // namespace kiln::apps::mnist
