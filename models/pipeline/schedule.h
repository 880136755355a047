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
//   ZB-H1   1F1B with each backward split in two (Qi et al., "Zero Bubble Pipeline
//   ZB-H2   Parallelism", ICLR 2024, https://arxiv.org/abs/2401.10241): B i, the gradient of the
//           stage's input, which stage s-1 waits for, and W i, the gradient of the stage's
//           weights, which nobody waits for, so it can run later and fill a bubble.
//           ZB-H1: 1F1B's forwards and B's; stage s holds back its first s W's, then runs one
//           W after each B, and the held-back W's at the end. Stage s then has p micro-batches
//           in flight (F run, W not yet), as many as stage 0 of 1F1B. With T_F = T_B = T_W
//           every stage idles (p - 1) T_F per step instead of 1F1B's 3 (p - 1) T_F (m >= p).
//           p = 3, m = 4, one column per unit of time ('.' = idle):
//             stage 0  F0 F1 F2 .  .  B0 W0 F3 B1 W1 B2 W2 B3 W3
//             stage 1  .  F0 F1 .  B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
//             stage 2  .  .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3
//           ZB-H2: up to 2p - 1 micro-batches in flight; each stage, at every unit of time,
//           runs its next B if the gradient has arrived, else its next F if it has fewer than
//           2p - 1 in flight and the activation has arrived, else its oldest waiting W. The
//           warm-up runs 2(p - s) - 1 forwards, and the W's the stage saved up fill the waits
//           of the tail: with equal times and m >= 2p - 1 no stage idles except the (p - 1)
//           units by which the first and the last stage are offset (a parallelogram). With
//           exactly equal times ZB-H1 idles as little; ZB-H2 pulls ahead once the passes
//           differ or the transfers between stages cost time.
//   Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
//           Clusters Using Megatron-LM", SC 2021, https://arxiv.org/abs/2104.04473): each device
//           holds v chunks of the model (chunk c of device d is the model's (c p + d)-th piece),
//           so the fill and drain last 1/v as long: bubble (p - 1) / (v m + p - 1). The
//           micro-batches go in rounds of p: the forwards of a round through chunk 0, then the
//           same micro-batches through chunk 1, ...; backwards alike, from chunk v - 1 down.
//           Device d warms up with (v - 1) p + 2 (p - d - 1) forwards, then alternates, then
//           drains. When p does not divide m there are max(1, floor(m / p)) rounds, with sizes
//           that differ by at most one, larger first (one round of m when m < p), and the
//           warm-up counts (v - 1) times the first round's size instead of (v - 1) p.
//
// All end the step with every gradient accumulated over all m micro-batches, then one
// optimizer step: the same update as training on the whole batch (synchronous pipelining).
#pragma once

#include <string>
#include <vector>

namespace kiln {

enum class Schedule { Naive, GPipe, OneFOneB, ZeroBubbleH1, ZeroBubbleH2, Interleaved };

// "naive", "gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved"
const char* schedule_name(Schedule s);
Schedule parse_schedule(const std::string& name);  // an Error (Usage) lists the names
// Whether the schedule runs each backward as B then W (the zero-bubble ones).
bool splits_backward(Schedule s);

struct PipelineAction {
  // Backward: the whole backward, or, in a schedule that splits it, the input-gradient half B;
  // Weight: the weight-gradient half W.
  enum Kind { Forward, Backward, Weight } kind;
  int micro_batch;
  int chunk = 0;  // which of the device's model chunks (interleaved; else 0)
  bool operator==(const PipelineAction& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

// The actions of device `stage` (0-based) of `stages` for `micro_batches` micro-batches and
// `chunks` model chunks per device (chunks > 1 only for Interleaved, an Error (Usage)
// otherwise; Interleaved with one chunk is 1F1B; Naive requires micro_batches == 1). Every
// micro-batch's forward comes before its backward (and its backward before its weight pass),
// and the passes flow through FIFO queues: for every pair of neighbouring virtual stages, the
// forwards leave the first in the order the second runs them, the backwards likewise.
std::vector<PipelineAction> stage_actions(Schedule schedule, int stage, int stages,
                                          int micro_batches, int chunks = 1);

// The largest number of (micro-batch, chunk) pairs whose forward has run and whose backward
// (whose weight pass, in a split schedule) has not, at any point of the action list: the
// activations a stage must hold at once.
int peak_in_flight(const std::vector<PipelineAction>& actions);

}  // namespace kiln
