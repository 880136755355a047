// run_report.h: what mnist_train tells its user: the lines it prints (rank 0, unless --quiet)
// and the JSON summary it writes to --json.
//
//   mnist_train: cnn (1199882 parameters) on cpu:0, 1 thread per rank, vendor kernels, adadelta
//     lr 1 (x0.7 per epoch), batch 128, 2000 train / 500 test images, seed 1
//   data: MNIST: 2000 examples of 1x28x28, 10 classes, from ...; loader: 1 worker, prefetch 2
//     (--data-on-device: "...; on the device: 1.9 MiB of bytes, each batch gathered there by a
//     kernel")
//   step: eager (--cuda-graph replays it as one CUDA graph)               (a GPU, --dist none)
//   data parallel: local:2, 2 ranks (2 workers), allreduce ring, buckets 1 MiB, batch 64 per
//     worker = 128 global                                                   (--dist only)
//   epoch  1/1  train loss 1.5608  test loss 0.6939  test acc 77.40%  1628 img/s  1.4 s (train
//     1.2 s, eval 0.2 s)
//   rank 0: weights equal rank 0's                  (--dist: every worker rank, dist_training.h)
//   test accuracy 77.40% after 1 epoch; median 1628 img/s; peak RSS 401 MB, tensors 288 MB
//   communication: 0.14 s of allreduce, 73% hidden behind backward, 76.8 MB sent by rank 0
//
// (each line is one line of output; wrapped here). From `mnist_train --dist local:2
// --limit-train 2000 --limit-test 500 --epochs 1` on the 2-core development machine.
//
// The tests (tests/apps/mnist_train_*_test.cpp) read these lines and the JSON fields: change
// them together.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/train_checkpoint.h"
#include "apps/mnist/datasets.h"
#include "apps/mnist/dist_training.h"
#include "apps/mnist/options.h"
#include "apps/mnist/train_loop.h"
#include "engine/device.h"
#include "engine/optim/grad_scaler.h"
#include "layers/module.h"

namespace kiln::apps::mnist {

// What a worker rank trains with, decided before the first step.
struct RunPlan {
  Device device;
  RankLayout ranks;
  int64_t rank_batch = 0;    // examples per step on this rank
  int64_t global_batch = 0;  // examples per step over all workers
  int64_t warmup_steps = 0;  // --batch-per-rank: steps of linear learning-rate warm-up
  int start_epoch = 0;       // epochs done before this run (--resume)
  int64_t start_position = 0;  // examples of epoch start_epoch done before (a mid-epoch --resume)
};

// The lines before the first epoch: model, device, threads, kernels, optimizer, batch, data,
// loader, and with --dist how the ranks exchange gradients.
void print_run_header(const Options& o, const RunPlan& plan, const Module& model,
                      const Datasets& data);

// One line per epoch; epoch is 0-based, epoch_seconds includes evaluation; `rate` ends the
// line (the training FLOP rate, apps/common/step_flops.h).
void print_epoch_line(const Options& o, int epoch, const EpochResult& r, double epoch_seconds,
                      const std::string& rate = "");

// The summary of the run, for --json. Epoch seconds include evaluation; images/s counts the
// training loop only, all ranks' images together. The *_per_epoch fields are this process's
// epochs (after a --resume, from start_epoch on); "history" is the whole run's (`history`: the
// resumed checkpoint's epochs, then this process's).
nlohmann::json summary_json(const Options& o, const RunPlan& plan, const Datasets& data,
                            const std::vector<EpochResult>& results,
                            const std::vector<apps::EpochRecord>& history,
                            const CommSummary& traffic,
                            bool replicas_equal, const GradScaler* scaler = nullptr,
                            int64_t graph_replays = 0);

// Writes `j` to `path` (--json) atomically (engine/output_file.h); a failed write is a Runtime
// error naming the file and the system's reason, and leaves a previous file as it was.
void write_json(const std::string& path, const nlohmann::json& j);

// The closing lines: final accuracy, speed and memory; with synchronous --dist, communication.
void print_closing_lines(const Options& o, const RunPlan& plan,
                         const std::vector<EpochResult>& results, const CommSummary& traffic);

}  // namespace kiln::apps::mnist
