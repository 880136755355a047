// agreement.cpp: see agreement.h.
#include "comm/agreement.h"

#include "engine/autograd.h"

namespace kiln::comm {

bool any_rank(Communicator& comm, bool flag) {
  NoGradGuard no_grad;
  // A sum of 0s and 1s: exact in f32 for any realistic number of ranks (up to 2^24).
  Tensor t = Tensor::full({1}, flag ? 1.0 : 0.0, DType::F32, comm.transport().device());
  comm.allreduce(t, ReduceOp::Sum, Algorithm::Ring);
  return t.item() > 0.5;
}

}  // namespace kiln::comm
