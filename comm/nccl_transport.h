// nccl_transport.h: NCCL point-to-point as a Transport: GPU memory to GPU memory, one GPU per
// rank (built only with a real CUDA toolkit that ships NCCL: KILN_WITH_NCCL).
//
// The rendezvous is Horovod's: MPI starts the processes and says who is who (rank, size, local
// rank), rank 0 creates an ncclUniqueId and sends it to every rank over MPI, and every rank
// joins the NCCL communicator with it (ncclCommInitRank). Rank r then drives GPU local_rank of
// its host, so `mpirun -np 4` on a 4-GPU machine gives one GPU per rank.
//
// Differences from the MPI transport that an algorithm must respect:
//   - buffers are on device() (this rank's GPU), never host memory;
//   - a receive must name its peer (NCCL has no any-source receive) and its size must be the
//     size of the message (NCCL matches counts, it has no "buffer larger than the message");
//   - the transfers run on the transport's own CUDA stream: start() orders them after the
//     work already queued on the calling thread's current stream, and wait() returns once
//     they are done on the GPU.
#pragma once

#include <memory>

#include "comm/transport.h"

namespace kiln::comm {

// MPI for the rendezvous (initialised on first use), then NCCL on GPU local_rank. A host with
// fewer GPUs than ranks is a Usage error.
std::shared_ptr<Transport> make_nccl_transport();

}  // namespace kiln::comm
