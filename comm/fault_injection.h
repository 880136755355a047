// fault_injection.h: KILN_FAULT, a testing aid that makes one rank die at a chosen step.
//
// Fault tolerance cannot be tested without faults. Like NCCL's debugging variables
// (NCCL_DEBUG, ...), KILN_FAULT is read from the environment and does nothing when unset:
//
//   KILN_FAULT="rank=1,step=5"            rank 1 fails at its 5th data-parallel step
//   KILN_FAULT="rank=1,step=5,how=kill"   ... dies of SIGKILL (a crash, the OOM killer)
//   KILN_FAULT="rank=1,step=5,how=exit"   ... calls _exit(137) (no destructor, no MPI_Finalize)
//
// The step is that rank's DataParallel step, from 1 (stats().steps + 1 when synchronize() is
// called: a step that allreduced counts, a no_sync() micro-batch does not): the fault fires
// after backward, when the hooks have launched the step's gradient allreduces, so the other
// ranks are waiting in the allreduce for the dying rank's data. how=throw (the default) throws
// kiln::Error from the rank's training thread, as any failure of a rank's code would; with
// ranks as threads (--dist local:N, nccl:N) that is the only meaningful kind, since kill and
// exit end the whole process, every rank at once. kill and exit are for one rank per process
// (mpirun). The fault fires once per process. tools/rank_death.sh and the rank-death tests use
// it; nothing else should.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::comm {

enum class FaultKind : uint8_t { Throw, Kill, Exit };

struct FaultPlan {
  int rank = -1;      // -1: no fault
  int64_t step = 0;   // >= 1
  FaultKind kind = FaultKind::Throw;
  bool enabled() const { return rank >= 0; }
};

// Parses "rank=R,step=S[,how=throw|kill|exit]"; "" gives a disabled plan. Anything else is a
// Usage error naming KILN_FAULT and the expected form.
FaultPlan parse_fault_plan(const std::string& spec);

// The plan in KILN_FAULT (read once per process).
const FaultPlan& fault_plan_from_env();

// Fires the planned fault when `rank` reaches `step` (prints "KILN_FAULT: rank R dies at step
// S (how)" to stderr first). Returns otherwise.
void maybe_inject_fault(int rank, int64_t step);

}  // namespace kiln::comm
