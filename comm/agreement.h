// agreement.h: one flag agreed on by every member rank of a communicator.
//
// Data-parallel ranks must take the same decisions, or their replicas part: loss scaling
// (engine/optim/grad_scaler.h) skips a step when a gradient holds inf or NaN, and after the
// gradients' average every rank would see the same inf, but a rank that checks its own
// gradients before averaging (or whose average was taken without the overflowing values, as a
// compressed wire might) may not. any_rank() settles it: every rank skips when any rank found one.
//
//   bool inf = scaler.unscale_(params);
//   if (scaler.update(comm::any_rank(*comm, inf))) opt.step();
#pragma once

#include "comm/communicator.h"

namespace kiln::comm {

// True on every member rank when `flag` is true on at least one. A collective: every member
// rank calls it, in the same order as its other collectives. One f32 allreduce of one element
// on the transport's device.
bool any_rank(Communicator& comm, bool flag);

}  // namespace kiln::comm
