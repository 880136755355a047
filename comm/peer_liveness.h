// peer_liveness.h: is the process of another rank on this host still alive? (Linux /proc)
//
// When a rank's process dies (a crash, SIGKILL from the OOM killer or from a person), the ranks
// waiting for it learn nothing from MPI: a receive from a dead peer just never completes, and
// the launcher then ends the job with its own banner (Open MPI 4.1: "mpirun noticed that
// process rank 1 with PID 0 on node vm exited on signal 9 (Killed)": the PID it prints is
// wrong). The survivors' own output would then say nothing about the cause. But a peer on the
// same host can be checked directly: every rank tells the others its (host key, pid, start
// time) when the transport starts, and a waiting rank looks at /proc/<pid>/stat of the peers
// that share its host:
//
//   no such file, or a start time that differs   the process is gone (reaped; or the pid reused)
//   state Z (zombie) or X (dead)                 it died and its parent (mpirun's daemon) has
//                                                not reaped it yet: a SIGKILLed child of
//                                                mpirun can stay a zombie for a moment
//
// The host key is the host name plus the pid namespace (/proc/self/ns/pid), so two containers
// that share a host name never compare each other's pids. Peers on other hosts cannot be seen
// this way: a wait for them ends with the transport's timeout (KILN_COMM_TIMEOUT_S), or when
// the launcher ends the job.
//
// This file also holds the SIGTERM handler of one-rank-per-process jobs. After a rank dies,
// Open MPI's mpirun sends the others SIGCONT, SIGTERM about a second later, then SIGKILL
// (measured with Open MPI 4.1.4); Slurm sends SIGTERM on scancel, at the time limit and with
// srun --kill-on-bad-exit. By default a process then vanishes without a word. The handler
// prints one line naming the same-host peers that are already gone (exit 1: a rank died, a
// runtime failure) or saying that the job was ended from outside (exit 143 = 128 + SIGTERM),
// and exits at once. "Gone" is all it can know: when the launcher forwards its own SIGTERM to
// every rank (mpirun on SIGTERM, scancel), a peer may have ended a moment earlier from the
// same signal, so the line says "died or exited".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::comm {

// Who a rank's process is, as the other ranks see it.
struct PeerProcess {
  int rank = -1;
  std::string host_key;    // this_host_key() of its host
  int pid = 0;
  uint64_t start_time = 0; // process_start_time(pid) when the transport started; 0: unknown
};

// This host's name and pid namespace ("vm pid:[4026531836]").
std::string this_host_key();

// Field 22 of /proc/<pid>/stat (clock ticks after boot); 0 when the process does not exist.
uint64_t process_start_time(int pid);

enum class PeerState : uint8_t { Alive, Gone, Zombie, Remote };

// The state of `peer` seen from a process whose host key is `my_host_key`.
PeerState peer_state(const PeerProcess& peer, const std::string& my_host_key);

// Every rank's process (index = rank) and the checks on the ones that share this rank's host.
class PeerTable {
 public:
  PeerTable() = default;
  PeerTable(int my_rank, std::vector<PeerProcess> all);
  int my_rank() const { return my_rank_; }
  const std::vector<PeerProcess>& all() const { return all_; }
  // Ranks other than this one on this host.
  int local_peers() const;
  // "rank 1 (pid 4242 on vm) has died (its process is gone)" for every dead same-host peer,
  // joined by "; ", or "" when every one is alive.
  std::string dead_peers() const;

 private:
  int my_rank_ = -1;
  std::string my_host_key_;
  std::vector<PeerProcess> all_;
};

// Installs the SIGTERM handler described above for this process, which is rank `table.my_rank()`
// of `world` ranks on transport `transport_name`: its line reads
//   "kiln: rank 0/3 (mpi): stopped by SIGTERM after rank 1 (pid 4242) on this host died or exited"
// Leaves a handler the program installed itself in place (returns false then). The table is
// copied into fixed storage so the handler needs no allocation (it is async-signal-safe).
bool install_sigterm_report(const PeerTable& table, int world, const char* transport_name);

// After this process has reported its own failure and is ending the job (Transport::abort),
// the launcher's SIGTERM is only the echo of it: the handler then exits 1 without a line.
void quiet_sigterm_report() noexcept;

}  // namespace kiln::comm
