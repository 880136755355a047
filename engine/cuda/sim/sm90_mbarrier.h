// sim/sm90_mbarrier.h: the CUDA simulator's Hopper mbarriers, the simulated side of
// engine/cuda/sm90/mbarrier.h (docs/cuda_simulator.md, "Hopper: mbarriers and the TMA").
//
// Semantics from the PTX ISA, "Parallel Synchronization and Communication Instructions:
// mbarrier" (https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-mbarrier):
// a barrier object in shared memory counts the arrivals still missing in its current phase and
// a transaction count (bytes that asynchronous copies announced with expect-tx and have yet to
// complete). The phase completes when both reach zero; then the next phase starts with the
// full arrival count. A wait on parity p returns once the phase of parity p has completed, i.e.
// while the current phase's parity differs from p.
//
// The model: the state lives beside the object, in a table of the running block keyed by the
// object's address (the 8 bytes themselves are left alone). A wait that cannot return yet
// yields its fiber (sim/scheduler.h, poll_yield), so the other threads of the block run; a
// block in which every thread waits and none can progress fails as a deadlock naming the
// barrier. Copies the TMA has issued against a barrier (sim/sm90_tma.cpp) land, and complete
// their transaction bytes, the first time some thread tests that barrier once they are issued:
// data read before a wait on it is the NaN the TMA wrote when the copy was issued.
// Faults of the running kernel (kiln::Error naming the rule): a barrier not initialised in
// this block, not in shared memory or not 8-byte aligned, an arrival count outside
// [1, 2^20 - 1], an arrival on a phase that has had all its arrivals (count underflow), a
// transaction count leaving [-(2^20 - 1), 2^20 - 1], a parity other than 0 or 1.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::sim::sm90 {

// One thread initialises: `arrivals` per phase, phase 0 current, no transaction bytes.
void mbarrier_init(void* bar, uint32_t arrivals);
// expect-tx of `tx_bytes` (0: none), then one arrival.
void mbarrier_arrive(void* bar, uint32_t tx_bytes);
// Whether the phase of parity `parity` has completed; when not, the fiber yields once (the
// hardware suspends a try_wait for a while) and tests again.
bool mbarrier_try_wait(void* bar, uint32_t parity);
// Until the phase of parity `parity` has completed, yielding in between.
void mbarrier_wait(void* bar, uint32_t parity);

// The TMA's side: a copy of `bytes` to `dst` (shared memory) whose completion counts
// bytes.size() transaction bytes on `bar`. `fn` names the issuing call in faults.
void mbarrier_add_copy(void* bar, unsigned char* dst, std::vector<unsigned char> bytes,
                       const char* fn);

}  // namespace kiln::sim::sm90
