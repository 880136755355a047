// schedule.h: mnist_train's learning-rate schedules (--lr-schedule) and named recipes (--recipe).
//
//   step      StepLR: --lr x --gamma^epoch, set at the start of each epoch (the default; the
//             PyTorch MNIST example's recipe with Adadelta)
//   cosine    CosineLR: half a cosine from --lr down to 0 over all the run's optimizer steps
//   onecycle  OneCycleLR (Smith and Topin 2017): from --lr / --div-factor up to --lr over
//             --pct-start of the steps, then down (--anneal cos | linear) to
//             --lr / (--div-factor x --final-div-factor)
//   cyclic    CyclicLR (Smith 2017): triangles between --base-lr and --lr, each side
//             --half-cycle-epochs long; --cyclic-mode triangular2 halves the height every cycle
// All but step are set before every optimizer step, as pure functions of the global step
// (epoch x steps per epoch + batch), so --resume continues them exactly. Their closed forms
// and the papers are in engine/optim/lr_schedule.h.
//
// --recipe fast sets, for every flag not given on the command line, the values of
// kFastRecipe below (flags given explicitly win, so `--recipe fast --epochs 1` is the fast
// recipe cut to one epoch).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/mnist/options.h"
#include "engine/optim/lr_schedule.h"

namespace kiln::apps::mnist {

// The fast recipe: the fewest seconds of training to >= 99.0% MNIST test accuracy on a 2-core
// CPU (measurements in schedule.cpp, next to the values).
struct FastRecipe {
  const char* optimizer;
  double lr;           // the peak of the one-cycle schedule
  int64_t batch_size;
  int epochs;
  double pct_start;
  const char* precision;  // --precision
};
extern const FastRecipe kFastRecipe;

// --recipe: fills the recipe's values into the flags the user did not give. With --recipe
// default and --model resnet18, the ResNet's recipe (kResNetRecipe) instead of the CNN's
// Adadelta defaults.
void apply_recipe(Options& o, const CLI::App& app);

// --model resnet18's defaults: SGD (momentum 0.9) on a one-cycle schedule, measured in
// schedule.cpp.
struct ResNetRecipe {
  const char* optimizer;
  double lr;  // the peak of the one-cycle schedule
  int epochs;
};
extern const ResNetRecipe kResNetRecipe;

// Usage errors (exit 2) for flags that belong to another schedule, --gamma without step,
// --lr-schedule with --batch-per-rank, --base-lr above --lr. Call after apply_recipe and once
// o.lr holds the optimizer's default.
void check_schedule_flags(const Options& o, const CLI::App& app);

// True when the schedule is set before every optimizer step (all but step).
bool schedule_per_step(const Options& o);

// The schedule for --lr-schedule (not --batch-per-rank's, which mnist_train.cpp builds).
// total_steps: the optimizer steps of the whole run (--epochs x steps per epoch).
std::shared_ptr<LRSchedule> make_schedule(const Options& o, int64_t steps_per_epoch,
                                          int64_t total_steps);

// "StepLR x0.7 per epoch", "one-cycle, peak 0.004 at 30% of 938 steps (cos)", ... for the header.
std::string describe_schedule(const Options& o);

// The schedule and its parameters, for the JSON summary.
nlohmann::json schedule_json(const Options& o);

}  // namespace kiln::apps::mnist
