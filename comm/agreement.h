// agreement.h: what every member rank of a run must agree on, checked or settled across ranks.
//
// 1. Settings (check_ranks_agree). Ranks started with different flags part ways: a different
//    --model broadcasts parameters of another shape, a different --allreduce runs another
//    algorithm whose messages nobody receives (a hang), a different --batch-size sends a message
//    larger than its receive buffer. So at start, before any parameter travels, the ranks compare
//    a list of (name, value) pairs, and every rank refuses the run with the same Usage error
//    (exit 2) naming what differs and where:
//
//      comm::check_ranks_agree(*t, {{"--model", o.model}, {"--batch-size", "128"}});
//      -> ranks disagree on --model: rank 0 cnn, rank 1 mlp; every rank must be started with
//         the same flags
//
//    How, on any transport: every rank sends rank 0 the length of its encoded list (a fixed-size
//    message), then the list, into a buffer of exactly that length; rank 0 compares every list
//    with its own and sends each rank the verdict the same way (length, then text). So lists
//    that differ in length, in count or in names can never mismatch a receive buffer or leave a
//    receive waiting; and a rank that never arrives is a dead peer or a timeout, as for any
//    other message (transport.h).
//
// 2. One flag (any_rank). Data-parallel ranks must take the same decisions, or their replicas
//    part: loss scaling (engine/optim/grad_scaler.h) skips a step when a gradient holds inf or
//    NaN, and after the gradients' average every rank would see the same inf, but a rank that
//    checks its own gradients before averaging (or whose average was taken without the
//    overflowing values, as a compressed wire might) may not. any_rank() settles it: every rank
//    skips when any rank found one.
//
//      bool inf = scaler.unscale_(params);
//      if (scaler.update(comm::any_rank(*comm, inf))) opt.step();
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/transport.h"

namespace kiln::comm {

// One thing the ranks must share: a flag's name ("--model") and its value as text ("cnn"), or
// any other named fact ("parameters", "1199882 in 8 tensors").
struct Setting {
  std::string name;
  std::string value;
};

// Returns on every member rank when every member's `settings` equal rank 0's (the same names,
// values and order); otherwise throws kiln::Error (Usage) on every member rank, with the same
// message: "ranks disagree on --model: rank 0 cnn, rank 1 mlp; on --batch-size: ranks 0-2 128,
// rank 3 64; every rank must be started with the same flags". A name one rank lacks shows as
// "(not set)". Members: ranks [0, members) of `t` (-1: all); every member calls it at the same
// point, before its other messages; other ranks return at once. It uses the transport
// directly (any Communicator's worker may be idle or absent); on a GPU transport the bytes are
// staged through device memory.
//
// on_refusal, when given, runs on rank 0 with the message before any other rank learns the
// verdict: the place to print it. Under mpirun that matters: the job ends as soon as one
// process exits with an error, and a rank 0 that had not printed yet would never say why.
void check_ranks_agree(Transport& t, const std::vector<Setting>& settings, int members = -1,
                       const std::function<void(const std::string&)>& on_refusal = {});

// The text a rank's settings travel as (a magic word, then each name and value with its
// length), and back; decode returns false for bytes that are not such a list. Exposed for tests.
std::string encode_settings(const std::vector<Setting>& settings);
bool decode_settings(const std::string& bytes, std::vector<Setting>& out);

// True on every member rank when `flag` is true on at least one. A collective: every member
// rank calls it, in the same order as its other collectives. One f32 allreduce of one element
// on the transport's device.
bool any_rank(Communicator& comm, bool flag);

}  // namespace kiln::comm
