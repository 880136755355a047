// channel.h: the queue between two neighbouring pipeline stages (activations forward,
// gradients backward). One sender thread, one receiver thread, FIFO.
//
// A message carries a tensor already on the receiver's device. On GPUs the sender's copy is
// queued on the sender thread's stream of the receiver's device (its copy stream), so it
// overlaps the sender's next computation; the message carries an event recorded after the
// copy, and the receiver's stream waits for that event before using the tensor. Any stage
// that fails aborts every channel, so no stage waits forever for a message that will not come.
#pragma once

#include <condition_variable>
#include <deque>
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

// Thrown by pop() on a channel aborted because another stage failed.
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

  // Blocks until a message arrives; throws ChannelAborted once abort() was called.
  ChannelMessage pop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return aborted_ || !queue_.empty(); });
    if (aborted_) throw ChannelAborted{};
    ChannelMessage m = std::move(queue_.front());
    queue_.pop_front();
    return m;
  }

  void abort() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_ = true;
    }
    cv_.notify_all();
  }

  // Empties the channel and clears an abort: the start of a new step.
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    aborted_ = false;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChannelMessage> queue_;
  bool aborted_ = false;
};

}  // namespace kiln
