// schedule.h: the order in which each pipeline stage runs the forward and backward passes of
// the micro-batches of one training step.
//
// p stages, m micro-batches; F i / B i = forward / backward of micro-batch i on this stage.
//
//   Naive   m = 1: the whole batch goes through stage 0, then stage 1, ...; one stage works at
//           a time. What "model parallel" means at its simplest, and slower than one device,
//           since the copies between devices are added and nothing overlaps.
//   GPipe   F 0 .. F m-1, then B m-1 .. B 0 (Huang et al., "GPipe: Efficient Training of Giant
//           Neural Networks using Pipeline Parallelism", 2019, https://arxiv.org/abs/1811.06965).
//           While stage s computes F i, stage s+1 computes F i-1: the stages overlap, except
//           in the fill and drain. With equal stages the idle share (the bubble) is
//           (p - 1) / (m + p - 1). Every stage keeps the activations of all m micro-batches
//           until their backward.
//   1F1B    warm-up of p - s - 1 forwards, then alternately one forward and one backward,
//           then the remaining backwards (PipeDream-Flush: Narayanan et al., "Memory-Efficient
//           Pipeline-Parallel DNN Training", 2021, https://arxiv.org/abs/2006.09503). Same
//           bubble as GPipe, but a micro-batch's backward starts as soon as it can, so stage s
//           holds at most p - s micro-batches' activations instead of m.
//
// Both end the step with every gradient accumulated over all m micro-batches, then one
// optimizer step: the same update as training on the whole batch (synchronous pipelining).
#pragma once

#include <string>
#include <vector>

namespace kiln {

enum class Schedule { Naive, GPipe, OneFOneB };

const char* schedule_name(Schedule s);        // "naive", "gpipe", "1f1b"
Schedule parse_schedule(const std::string& name);  // an Error (Usage) lists the names

struct PipelineAction {
  enum Kind { Forward, Backward } kind;
  int micro_batch;
  bool operator==(const PipelineAction& o) const {
    return kind == o.kind && micro_batch == o.micro_batch;
  }
};

// The actions of `stage` (0-based) of `stages` for `micro_batches` micro-batches (Naive
// requires micro_batches == 1). Every micro-batch's forward comes before its backward, and
// every stage runs its backwards in the same order (so gradients can flow through FIFO queues).
std::vector<PipelineAction> stage_actions(Schedule schedule, int stage, int stages,
                                          int micro_batches);

// The largest number of micro-batches whose forward has run and backward has not, at any point
// of the action list: the activations a stage must hold at once.
int peak_in_flight(const std::vector<PipelineAction>& actions);

}  // namespace kiln
