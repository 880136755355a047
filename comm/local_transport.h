// local_transport.h: N ranks as threads of one process (teaching, tests, one-box training).
//
//   comm::run_local(4, [](std::shared_ptr<comm::Transport> t) {
//     comm::Communicator comm(t);
//     ... comm.allreduce(grad) ...
//   });
//
// Each rank owns a mailbox. A send copies its bytes into the destination's mailbox at once
// (eager protocol: a send never waits for its receiver, so it never deadlocks); a receive
// waits until a matching message is there and copies it out. One mutex and one condition
// variable per mailbox; nothing else is shared between ranks.
//
// Failure: when a rank's function throws, run_local marks the group failed, every rank
// blocked in a wait throws "rank k failed: <its error>" at once (check_peers()), and so does
// every later start(), so no message of a failed group reaches a mailbox; run_local joins all
// threads and rethrows the first rank's error. A wait that outlives the timeout throws as well.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/transport.h"

namespace kiln::comm {

// n connected transports, rank i at index i. Keep them alive while any rank uses them.
std::vector<std::shared_ptr<Transport>> make_local_group(int n);

// Runs fn(transport of rank r) on n threads, r = 0..n-1, and joins them. Rethrows the error of
// the first rank that failed (the others then fail with "rank k failed" and are not reported).
void run_local(int n, const std::function<void(std::shared_ptr<Transport>)>& fn);

}  // namespace kiln::comm
