// flags.h: mnist_train's flags (CLI11), and the checks made on them before any work starts.
//
// add_flags declares every flag with its help text and its range or choices (the words of
// apps/common/flag_checks.h: `--epochs must be at least 1 (got 0)`); the data-parallel flags'
// combinations are checked in dist_flags.h, the schedule's in schedule.h. The checks here are
// the ones a range cannot express, each a Usage error (exit 2) that says what to change.
#pragma once

#include <string>

#include "apps/mnist/options.h"

namespace CLI {
class App;
}

namespace kiln::apps::mnist {

// Every flag of mnist_train, bound to the fields of `o`.
void add_flags(CLI::App& app, Options& o);

// --memory-format and --activations 16bit belong to --model resnet18: with cnn or mlp they are
// usage errors.
void check_model_flags(const Options& o, const CLI::App& app);

// --activations as given, else the model's default: 16bit for resnet18, f32 for the others.
std::string activations_of(const Options& o);

// Fails now, not after an hour of training, when an output (--json, --checkpoint, --trace)
// cannot be written or would replace something else: a device, a FIFO, a directory, another
// output, the data or --resume (which --checkpoint may name: a run continued in place). See
// apps/common/output_paths.h.
void check_output_flags(const Options& o);

// A batch the loaders could never hold in this machine's memory is refused before anything is
// allocated.
void check_batch_sizes_fit(const Options& o);

// --checkpoint-every needs --checkpoint, and cannot go with --ps-async.
void check_checkpoint_flags(const Options& o);

}  // namespace kiln::apps::mnist
