// algo_util.h: what comm's algorithms share (internal to kiln_comm): the message tags that keep
// one algorithm's messages apart from another's, chunk arithmetic, scratch buffers on the
// transport's device, and argument checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/transport.h"
#include "engine/tensor.h"

namespace kiln::comm {

// One tag per algorithm (and per message kind of the parameter server). Messages are matched
// on (source, tag), so a ring's chunk can never be taken by a halving-doubling receive, even
// when the two run back to back and a fast rank is already one collective ahead. User
// point-to-point messages (Communicator::send) use small tags; these start high.
enum Tag : int {
  kTagRing = 1000,
  kTagReduceScatter,
  kTagAllgather,
  kTagBroadcast,
  kTagBarrier,
  kTagHalvingDoubling,
  kTagPsPush,       // parameter server, synchronous allreduce: shard to its owner
  kTagPsResult,     // ... and the summed shard back
  kTagPsHeader,     // parameter server, dedicated servers: fixed-size header (any source)
  kTagPsPayload,    // ... the payload that follows a header, from the same source
  kTagPsReply,      // ... the server's answer to a worker
  kTagBinaryBlocks,
  kTagAgreementLength,   // check_ranks_agree (agreement.h): fixed-size length of what follows
  kTagAgreementPayload,  // ... the settings, or rank 0's verdict
};

// Chunk c of K elements cut into n balanced chunks: the first K % n chunks hold one element
// more. Counts smaller than n give empty chunks at the end.
inline int64_t chunk_count(int64_t K, int n, int c) { return K / n + (c < K % n ? 1 : 0); }
inline int64_t chunk_offset(int64_t K, int n, int c) {
  return c * (K / n) + (c < K % n ? c : K % n);
}

// A scratch buffer of `count` elements of `type` on `device` (a tensor from the engine's caching
// allocator, host or CUDA).
class Scratch {
 public:
  Scratch(ElemType type, int64_t count, Device device);
  Buffer buffer() const { return buf_; }

 private:
  Tensor device_mem_;  // host or device memory, from the engine's allocators
  Buffer buf_;
};

// One step of a ring-like algorithm: sends `send` to rank `to` while receiving `recv_into`
// (recv_into.count elements) from rank `from`, both cut into sub-chunks of `sub` elements.
// Every sub-chunk is its own start(), all posted at once; they complete in order, and
// on_recv(offset, n) runs for each received sub-chunk as soon as it is in, while the next ones
// are still on the wire: that is the pipelining that hides the reduction behind the transfer.
// Either side may be empty (count 0): only the other direction travels. Checks that every
// sub-chunk received has the expected size (ranks that disagree on the count fail clearly).
void pipelined_exchange(Transport& t, const Buffer& send, int to, const Buffer& recv_into,
                        int from, int tag, int64_t sub,
                        const std::function<void(int64_t offset, int64_t n)>& on_recv = {});

// Sub-chunk size in elements for a byte budget (at least 1 element; 0 bytes: no splitting).
int64_t subchunk_elems(size_t bytes, ElemType type, int64_t count);

// dst = src (same type, count and device; CUDA: synchronized before returning).
void copy_buffer(const Buffer& dst, const Buffer& src);

// Checks shared by every algorithm: n is a valid member count, this rank is a member, the
// buffer is on the transport's device.
void check_algorithm_args(const Transport& t, int n, const Buffer& buf, const char* what);

}  // namespace kiln::comm
