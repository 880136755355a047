// local_transport.cpp: mailboxes between threads, with MPI's matching rules.
//
// Each rank's mailbox holds two queues under one mutex: messages that arrived before anyone
// asked for them, and receives posted before their message arrived. A send first looks for a
// posted receive that matches (oldest first) and copies straight into its buffer; otherwise it
// queues a copy of the message. A receive first looks for a queued message (oldest first);
// otherwise it queues itself. Either way the match is made in posting order, as MPI does, so
// several outstanding receives from one peer with one tag fill in the order they were posted.
#include "comm/local_transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace kiln::comm {
namespace {

using Clock = std::chrono::steady_clock;

struct RecvSlot {
  void* data;
  size_t capacity;
  int peer, tag;
  bool done = false;
  int source = -1;
  size_t bytes = 0;
  std::string error;  // a message larger than the buffer
};

struct Message {
  int source, tag;
  std::vector<char> bytes;
};

bool matches(const RecvSlot& r, int source, int tag) {
  return (r.peer == kAnySource || r.peer == source) && r.tag == tag;
}

// Copies a message into a posted receive (called with the mailbox locked).
void deliver(RecvSlot& r, int source, const void* data, size_t bytes) {
  r.source = source;
  r.bytes = bytes;
  if (bytes > r.capacity) {
    r.error = "a message of " + std::to_string(bytes) + " bytes from rank " +
              std::to_string(source) + " (tag " + std::to_string(r.tag) +
              ") does not fit the receive buffer of " + std::to_string(r.capacity) + " bytes";
  } else if (bytes > 0) {
    std::memcpy(r.data, data, bytes);
  }
  r.done = true;
}

struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Message> unexpected;                 // arrived, not yet asked for
  std::list<std::shared_ptr<RecvSlot>> posted;    // asked for, not yet arrived
};

struct Group {
  explicit Group(int n) : boxes(n) {}
  std::vector<Mailbox> boxes;
  std::atomic<bool> failed{false};
  std::mutex why_mu;
  std::string why;

  void fail(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(why_mu);
      if (failed.load()) return;
      why = reason;
      failed.store(true);
    }
    for (Mailbox& b : boxes) {
      std::lock_guard<std::mutex> lock(b.mu);  // a waiter between its check and its wait sees it
      b.cv.notify_all();
    }
  }
  std::string failure() {
    std::lock_guard<std::mutex> lock(why_mu);
    return why;
  }
};

class LocalTransport;

class LocalRequest : public Request {
 public:
  LocalRequest(LocalTransport& t, std::vector<std::shared_ptr<RecvSlot>> slots,
               std::vector<int> op_to_slot)
      : t_(t), slots_(std::move(slots)), op_to_slot_(std::move(op_to_slot)) {}
  ~LocalRequest() override;
  void wait() override;
  bool test() override;
  int source(size_t op) const override {
    const int s = op_to_slot_.at(op);
    return s < 0 ? -1 : slots_[s]->source;
  }
  size_t received_bytes(size_t op) const override {
    const int s = op_to_slot_.at(op);
    return s < 0 ? 0 : slots_[s]->bytes;
  }

 private:
  bool all_done_locked() const;
  void check_errors_locked() const;
  std::string describe_pending_locked() const;
  LocalTransport& t_;
  std::vector<std::shared_ptr<RecvSlot>> slots_;
  std::vector<int> op_to_slot_;  // op index -> slot index, -1 for sends
};

class LocalTransport : public Transport {
 public:
  LocalTransport(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}
  const char* name() const override { return "local"; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->boxes.size()); }
  int local_rank() const override { return rank_; }
  int local_size() const override { return size(); }
  std::string host() const override { return "localhost"; }

  std::unique_ptr<Request> start(const std::vector<P2POp>& ops) override {
    // Once the group has failed, nothing new enters a mailbox: a rank whose worker thread goes
    // on to its next queued collective must not hand a peer a message that the peer would
    // match against a receive of the collective that failed.
    if (!ops.empty()) check_peers("a new transfer with rank " + std::to_string(ops[0].peer));
    std::vector<std::shared_ptr<RecvSlot>> slots;
    std::vector<int> op_to_slot;
    for (const P2POp& op : ops) {
      check_peer(op);
      if (op.kind == P2POp::Send) {
        send(op);
        op_to_slot.push_back(-1);
      } else {
        slots.push_back(post_recv(op));
        op_to_slot.push_back(static_cast<int>(slots.size()) - 1);
      }
    }
    return std::make_unique<LocalRequest>(*this, std::move(slots), std::move(op_to_slot));
  }

  void check_peers(const std::string& waiting_for) const override {
    if (!group_->failed.load()) return;
    throw Error("rank " + std::to_string(rank_) + " (local): stopped waiting for " + waiting_for +
                " because " + group_->failure(), ErrorKind::Runtime);
  }

  void abort(const std::string& why) noexcept override {
    group_->fail("rank " + std::to_string(rank_) + " failed: " + why);
  }

  Mailbox& own_box() { return group_->boxes[rank_]; }
  Group& group() { return *group_; }

 private:
  void check_peer(const P2POp& op) const {
    const bool any_ok = op.kind == P2POp::Recv && op.peer == kAnySource;
    KILN_CHECK(any_ok || (op.peer >= 0 && op.peer < size()), "local transport: rank ", rank_,
               ": peer ", op.peer, " is not a rank of this group of ", size());
    KILN_CHECK(op.tag >= 0, "local transport: tags must be >= 0, got ", op.tag);
  }

  void send(const P2POp& op) {
    Mailbox& box = group_->boxes[op.peer];
    {
      std::lock_guard<std::mutex> lock(box.mu);
      auto it = std::find_if(box.posted.begin(), box.posted.end(),
                             [&](const auto& r) { return matches(*r, rank_, op.tag); });
      if (it != box.posted.end()) {
        deliver(**it, rank_, op.data, op.bytes);
        box.posted.erase(it);
      } else {
        const char* p = static_cast<const char*>(op.data);
        box.unexpected.push_back(Message{rank_, op.tag, std::vector<char>(p, p + op.bytes)});
      }
    }
    box.cv.notify_all();
    count_sent(op.bytes);
  }

  std::shared_ptr<RecvSlot> post_recv(const P2POp& op) {
    auto slot = std::make_shared<RecvSlot>();
    slot->data = op.data;
    slot->capacity = op.bytes;
    slot->peer = op.peer;
    slot->tag = op.tag;
    Mailbox& box = own_box();
    std::lock_guard<std::mutex> lock(box.mu);
    auto it = std::find_if(box.unexpected.begin(), box.unexpected.end(),
                           [&](const Message& m) { return matches(*slot, m.source, m.tag); });
    if (it != box.unexpected.end()) {
      deliver(*slot, it->source, it->bytes.data(), it->bytes.size());
      box.unexpected.erase(it);
    } else {
      box.posted.push_back(slot);
    }
    return slot;
  }

  std::shared_ptr<Group> group_;
  int rank_;
};

LocalRequest::~LocalRequest() {
  // Receives never completed (the caller gave up after an error): withdraw them, so no later
  // send writes into a buffer that may be gone.
  Mailbox& box = t_.own_box();
  std::lock_guard<std::mutex> lock(box.mu);
  for (const auto& s : slots_) {
    if (!s->done) box.posted.remove(s);
  }
}

bool LocalRequest::all_done_locked() const {
  return std::all_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->done; });
}

void LocalRequest::check_errors_locked() const {
  for (const auto& s : slots_) {
    if (!s->error.empty()) {
      // A mismatch while the group is failing is a symptom: report the cause.
      t_.check_peers(describe_pending_locked());
      throw Error("local transport: rank " + std::to_string(t_.rank()) + ": " + s->error,
                  ErrorKind::Runtime);
    }
  }
}

// The first receive not yet done: "a receive from rank 1 (tag 3)".
std::string LocalRequest::describe_pending_locked() const {
  for (const auto& s : slots_) {
    if (!s->done) {
      return "a receive from " +
             (s->peer == kAnySource ? std::string("any rank") : "rank " + std::to_string(s->peer)) +
             " (tag " + std::to_string(s->tag) + ")";
    }
  }
  return "a receive";
}

bool LocalRequest::test() {
  Mailbox& box = t_.own_box();
  std::lock_guard<std::mutex> lock(box.mu);
  check_errors_locked();
  return all_done_locked();
}

void LocalRequest::wait() {
  Mailbox& box = t_.own_box();
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(t_.timeout_seconds());
  std::unique_lock<std::mutex> lock(box.mu);
  while (!all_done_locked()) {
    t_.check_peers(describe_pending_locked());  // a failed rank ends every wait at once
    if (box.cv.wait_until(lock, deadline) == std::cv_status::timeout && !all_done_locked()) {
      throw timeout_error(t_, describe_pending_locked(), t_.timeout_seconds());
    }
  }
  check_errors_locked();
}

}  // namespace

std::vector<std::shared_ptr<Transport>> make_local_group(int n) {
  KILN_CHECK(n >= 1, "local transport: a group needs at least 1 rank, got ", n);
  auto group = std::make_shared<Group>(n);
  std::vector<std::shared_ptr<Transport>> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(std::make_shared<LocalTransport>(group, r));
  return ranks;
}

void run_local(int n, const std::function<void(std::shared_ptr<Transport>)>& fn) {
  std::vector<std::shared_ptr<Transport>> ranks = make_local_group(n);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(ranks[r]);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        ranks[r]->abort(e.what());
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        ranks[r]->abort("an unknown exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace kiln::comm
