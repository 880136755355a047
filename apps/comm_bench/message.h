// message.h: the buffer one allreduce sums, and the check that the sum is right.
//
// The check: each rank fills the buffer with small integers that depend on its rank and the
// element index (pattern), one allreduce (sum), and every element is compared with the exact
// sum (check_sum). Small integers add exactly in f32, f16 (up to 2048) and bf16 (up to 256), in
// any order, so any difference is a bug, never rounding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/transport.h"
#include "engine/tensor.h"

namespace kiln::apps::comm_bench {

// The check's value of element i on rank r: an integer in [-5, 5]; the sum over n ranks depends
// on i % 11 only.
inline int pattern(int64_t i, int r) { return static_cast<int>((i * 3 + r * 5) % 11) - 5; }

// The message buffer of one size, in the transport's device memory.
struct Message {
  Tensor data;  // U8, `bytes` long, on the transport's device
  comm::Buffer buf;
};

// `bytes` of `type` elements (bytes is a whole number of them) on the transport's device.
Message make_message(const comm::Transport& t, size_t bytes, comm::ElemType type);

// Fills rank r's pattern (check); on a GPU through a host tensor, copied over.
void fill_pattern(const comm::Transport& t, Message& m, int rank);

// True when every element is the sum of the n ranks' patterns; else says where it is not.
bool check_sum(const comm::Transport& t, const Message& m, int n, std::string* what);

}  // namespace kiln::apps::comm_bench
