// channel.h: the queue between two neighbouring pipeline stages (activations forward,
// gradients backward). One sender thread, one receiver thread, FIFO.
//
// A message carries a tensor already on the receiver's device. On GPUs the sender's copy is
// queued on the sender thread's stream of the receiver's device (its copy stream), so it
// overlaps the sender's next computation; the message carries an event recorded after the
// copy, and the receiver's stream waits for that event before using the tensor. A stage that
// fails in step k aborts every channel from step k on: a receive for step k or later then throws
// instead of waiting forever for a message that will not come, while a receive for an earlier
// step (consecutive steps overlap, pipeline.h) still gets its message, which is sure to come.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>

#include "engine/tensor.h"

namespace kiln {

#if KILN_WITH_CUDA
namespace cuda {
class Event;
}
#endif

struct ChannelMessage {
  int micro_batch = -1;
  Tensor tensor;
#if KILN_WITH_CUDA
  std::shared_ptr<cuda::Event> ready;  // recorded after the copy (GPU tensors only)
#endif
};

// Thrown by pop() on a channel aborted because a stage failed.
struct ChannelAborted {};

class Channel {
 public:
  void push(ChannelMessage message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(message));
    }
    cv_.notify_one();
  }

  // Blocks until a message of step `step` (a submission number) arrives; throws
  // ChannelAborted once the channel is aborted from that step or an earlier one.
  ChannelMessage pop(int64_t step) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return aborted_from_ <= step || !queue_.empty(); });
    if (aborted_from_ <= step) throw ChannelAborted{};
    ChannelMessage m = std::move(queue_.front());
    queue_.pop_front();
    return m;
  }

  void abort(int64_t from_step) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_from_ = std::min(aborted_from_, from_step);
    }
    cv_.notify_all();
  }

  // Empties the channel and clears an abort (no step in flight).
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    aborted_from_ = kNever;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChannelMessage> queue_;
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  int64_t aborted_from_ = kNever;
};

}  // namespace kiln
