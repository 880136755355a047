// algorithms.h: allreduce and friends, written once on Transport::start().
//
// Every function runs over the member ranks [0, n) of the transport (n <= t.size(); a rank
// >= n must not call it), on a Buffer in the transport's device memory, and is correct for any
// element count: 0, fewer elements than ranks, counts not divisible by n. All ranks call the
// same function with the same count and type. The result is bit-identical on every rank.
//
//   ring_allreduce              reduce-scatter then allgather around the ring, N chunks, each
//                               sent in pipelined sub-chunks. Sends 2(N-1)/N * K bytes per
//                               rank, whatever N: the bandwidth-optimal algorithm (Patarasuk and Yuan 2009).
//   halving_doubling_allreduce  recursive vector halving + distance doubling (Rabenseifner):
//                               log2(N) steps instead of 2(N-1), so better for small messages;
//                               a non-power-of-two N first folds the extra ranks into partners.
//   binary_blocks_allreduce     halving-doubling for any N without the fold (Rabenseifner and
//                               Träff 2004): N = 4 + 2 + 1 ranks form blocks of 4, 2 and 1, each
//                               halves and doubles inside itself, and the blocks pass partial
//                               sums up the chain and results back. No rank idles, none sends
//                               more than 2K; a power of two is exactly halving-doubling.
//   ps_allreduce                the parameter-server pattern (Dean et al. 2012): workers push their
//                               shard to the server that owns it, the server sums and sends the
//                               result back. Servers co-located (one shard per rank) or dedicated
//                               (ranks [n, n + S) run comm/parameter_server.h's serve()).
#pragma once

#include <cstddef>

#include "comm/transport.h"

namespace kiln::comm {

// Tuning shared by the algorithms (a Communicator keeps one: comm/communicator.h).
struct AlgorithmOptions {
  // Ring: each of the N chunks travels in sub-chunks of at most this many bytes, so the
  // reduction of one sub-chunk overlaps the transfer of the next (pipelining).
  size_t ring_subchunk_bytes = 1 << 20;
  // Parameter server (synchronous allreduce): shard layout. 0: one shard per member rank
  // (co-located servers); S > 0: S dedicated server ranks, ranks [members, members + S).
  int ps_servers = 0;
};

void ring_allreduce(Transport& t, int n, const Buffer& buf, ReduceOp op,
                    const AlgorithmOptions& options);
void halving_doubling_allreduce(Transport& t, int n, const Buffer& buf, ReduceOp op);
void binary_blocks_allreduce(Transport& t, int n, const Buffer& buf, ReduceOp op);
void ps_allreduce(Transport& t, int n, const Buffer& buf, ReduceOp op,
                  const AlgorithmOptions& options);

// The other collectives (ring-based; root-based ones as binomial trees).
// reduce_scatter: `in` holds n blocks of out.count elements; out = reduction of block rank.
void ring_reduce_scatter(Transport& t, int n, const Buffer& in, const Buffer& out, ReduceOp op);
// allgather: `out` holds n blocks of in.count elements; block r = rank r's `in`.
void ring_allgather(Transport& t, int n, const Buffer& in, const Buffer& out);
void tree_broadcast(Transport& t, int n, const Buffer& buf, int root);
void barrier(Transport& t, int n);

// Element-wise helpers on the buffer's device (CPU loops; CUDA kernels for GPU buffers).
// dst[i] += src[i] (f16: added in f32, rounded to nearest even).
void reduce_into(const Buffer& dst, const Buffer& src);
void scale(const Buffer& buf, double factor);

}  // namespace kiln::comm
