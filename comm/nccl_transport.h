// nccl_transport.h: NCCL point-to-point as a Transport: GPU memory to GPU memory, one GPU per
// rank (built with a CUDA toolkit that ships NCCL, or under the CUDA simulator, whose NCCL
// stand-in connects ranks that are threads of one process: KILN_WITH_NCCL).
//
// The rendezvous is Horovod's, over any other transport (the "bootstrap"): it says who is who
// (rank, size, local rank), rank 0 creates an ncclUniqueId and sends it to every rank through
// it, and every rank joins the NCCL communicator with it (ncclCommInitRank). Rank r then
// drives GPU local_rank of its host. Two bootstraps are ready-made:
//   make_nccl_transport()       MPI: `mpirun -np 4` on a 4-GPU machine gives one GPU per rank
//                               (processes on any hosts; needs a real GPU per rank)
//   run_nccl_local(n, fn)       n ranks as threads of this process on cuda:0..n-1, bootstrapped
//                               over the local transport (a multi-GPU box, or the simulator)
//
// Differences from the MPI transport that an algorithm must respect:
//   - buffers are on device() (this rank's GPU), never host memory;
//   - a receive must name its peer (NCCL has no any-source receive) and its size must be the
//     size of the message (NCCL matches counts, it has no "buffer larger than the message");
//   - the transfers run on the transport's own CUDA stream: start() orders them after the
//     work already queued on the calling thread's current stream, and wait() returns once
//     they are done on the GPU. A Communicator calls start() from its worker thread, so it
//     first orders that thread's stream after the submitting thread's (communicator.h).
#pragma once

#include <functional>
#include <memory>

#include "comm/transport.h"

namespace kiln::comm {

// Joins an NCCL communicator with the ranks of `bootstrap` (every rank calls it at the same
// point: it communicates), on GPU bootstrap->local_rank(). A host with fewer GPUs than ranks
// is a Usage error. abort() aborts the NCCL communicator, then the bootstrap.
std::shared_ptr<Transport> make_nccl_transport(std::shared_ptr<Transport> bootstrap);

// The MPI bootstrap (MPI initialised on first use). Under the CUDA simulator a job of more than
// one process is a Usage error pointing at run_nccl_local (`--dist nccl:N`).
std::shared_ptr<Transport> make_nccl_transport();

// Runs fn(nccl transport of rank r) on n threads, rank r on cuda:r, and joins them. A rank
// whose fn throws aborts the NCCL communicator (releasing the ranks waiting for it) and the
// local group; the first error is rethrown, as run_local does. Fewer than n GPUs is a Usage
// error before any thread starts.
void run_nccl_local(int n, const std::function<void(std::shared_ptr<Transport>)>& fn);

}  // namespace kiln::comm
