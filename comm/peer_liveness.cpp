// peer_liveness.cpp: /proc/<pid>/stat of same-host peers, and the SIGTERM report.
//
// Everything the signal handler runs is async-signal-safe (open, read, close, write, _exit and
// plain loops over fixed buffers: no malloc, no stdio), so the /proc reader below is written
// that way for everyone.
#include "comm/peer_liveness.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <utility>

namespace kiln::comm {
namespace {

// Reads /proc/<pid>/stat: the state letter (field 3) and the start time (field 22). False when
// the process does not exist. Async-signal-safe.
bool read_proc_stat(int pid, char* state, uint64_t* start_time) {
  char path[64] = "/proc/";
  char digits[16];
  int n = 0;
  for (unsigned v = static_cast<unsigned>(pid); n == 0 || v > 0; v /= 10) {
    digits[n++] = static_cast<char>('0' + v % 10);
  }
  size_t p = std::strlen(path);
  while (n > 0) path[p++] = digits[--n];
  std::memcpy(path + p, "/stat", 6);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  const ssize_t got = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (got <= 0) return false;
  buf[got] = '\0';
  // "pid (comm) S ppid ...": comm may hold spaces and ')', so fields count from the last ')'.
  const char* s = std::strrchr(buf, ')');
  if (s == nullptr || s[1] != ' ') return false;
  s += 2;
  *state = *s;
  // Field 3 is the state; field 22 the start time: skip 19 more separators.
  for (int field = 3; field < 22 && *s != '\0'; ++s) {
    if (*s == ' ') ++field;
  }
  uint64_t t = 0;
  for (; *s >= '0' && *s <= '9'; ++s) t = t * 10 + static_cast<uint64_t>(*s - '0');
  *start_time = t;
  return true;
}

PeerState state_of(int pid, uint64_t start_time) {
  char state = '?';
  uint64_t now_start = 0;
  if (!read_proc_stat(pid, &state, &now_start)) return PeerState::Gone;
  if (start_time != 0 && now_start != start_time) return PeerState::Gone;  // pid reused
  if (state == 'Z' || state == 'X' || state == 'x') return PeerState::Zombie;
  return PeerState::Alive;
}

// ---- the SIGTERM handler's fixed storage ------------------------------------------------

constexpr int kMaxLocalPeers = 256;
struct LocalPeer {
  int rank, pid;
  uint64_t start_time;
};
LocalPeer g_peers[kMaxLocalPeers];
int g_num_peers = 0;
char g_prefix[128];  // "kiln: rank 0/3 (mpi): stopped by SIGTERM"
volatile std::sig_atomic_t g_quiet = 0;  // this rank already said why the job ends

// Appends to a fixed buffer, never past its end. Async-signal-safe.
struct Line {
  char text[2048];
  size_t len = 0;
  void add(const char* s) {
    while (*s != '\0' && len + 1 < sizeof text) text[len++] = *s++;
  }
  void add(uint64_t v) {
    char d[24];
    int n = 0;
    do {
      d[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v > 0);
    while (n > 0 && len + 1 < sizeof text) text[len++] = d[--n];
  }
};

extern "C" void kiln_sigterm_report(int) {
  if (g_quiet) ::_exit(1);
  Line line;
  line.add(g_prefix);
  int dead = 0;
  for (int i = 0; i < g_num_peers; ++i) {
    const LocalPeer& p = g_peers[i];
    const PeerState s = state_of(p.pid, p.start_time);
    if (s == PeerState::Alive) continue;
    // "died or exited": a launcher that forwards its own SIGTERM to every rank can end a peer
    // a moment before this handler runs; a gone peer is a fact, why it went is not known here.
    line.add(dead++ == 0 ? " after " : ", ");
    line.add("rank ");
    line.add(static_cast<uint64_t>(p.rank));
    line.add(" (pid ");
    line.add(static_cast<uint64_t>(p.pid));
    line.add(")");
  }
  if (dead > 0) line.add(" on this host died or exited");
  if (dead == 0) {
    line.add(" (the launcher or the batch system ended the job; no rank on this host has died: "
             "see the launcher's message for the cause)");
  }
  line.add("\n");
  ssize_t unused = ::write(STDERR_FILENO, line.text, line.len);
  (void)unused;
  // A dead peer: the run failed (1). Otherwise: the conventional 128 + SIGTERM.
  ::_exit(dead > 0 ? 1 : 128 + SIGTERM);
}

}  // namespace

std::string this_host_key() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  char ns[128] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  return std::string(host) + " " + (n > 0 ? std::string(ns, static_cast<size_t>(n)) : "?");
}

uint64_t process_start_time(int pid) {
  char state = '?';
  uint64_t start = 0;
  return read_proc_stat(pid, &state, &start) ? start : 0;
}

PeerState peer_state(const PeerProcess& peer, const std::string& my_host_key) {
  if (peer.host_key != my_host_key || peer.pid <= 0) return PeerState::Remote;
  return state_of(peer.pid, peer.start_time);
}

PeerTable::PeerTable(int my_rank, std::vector<PeerProcess> all)
    : my_rank_(my_rank), my_host_key_(this_host_key()), all_(std::move(all)) {}

int PeerTable::local_peers() const {
  int n = 0;
  for (const PeerProcess& p : all_) n += p.rank != my_rank_ && p.host_key == my_host_key_;
  return n;
}

std::string PeerTable::dead_peers() const {
  std::string out;
  for (const PeerProcess& p : all_) {
    if (p.rank == my_rank_) continue;
    const PeerState s = peer_state(p, my_host_key_);
    if (s != PeerState::Gone && s != PeerState::Zombie) continue;
    if (!out.empty()) out += "; ";
    out += "rank " + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) + " on this host) "
           "has died (" + (s == PeerState::Zombie ? "a zombie: it exited or was killed"
                                                   : "its process is gone") + ")";
  }
  return out;
}

void quiet_sigterm_report() noexcept { g_quiet = 1; }

bool install_sigterm_report(const PeerTable& table, int world, const char* transport_name) {
  struct sigaction old {};
  if (::sigaction(SIGTERM, nullptr, &old) != 0) return false;
  const bool custom = (old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL;
  if (custom && old.sa_handler != kiln_sigterm_report) return false;  // the program's own

  // Fill the fixed storage before the handler can run.
  g_num_peers = 0;
  const std::string me = this_host_key();
  for (const PeerProcess& p : table.all()) {
    if (p.rank == table.my_rank() || p.host_key != me || g_num_peers == kMaxLocalPeers) continue;
    g_peers[g_num_peers++] = LocalPeer{p.rank, p.pid, p.start_time};
  }
  const std::string prefix = "kiln: rank " + std::to_string(table.my_rank()) + "/" +
                             std::to_string(world) + " (" + transport_name +
                             "): stopped by SIGTERM";
  std::strncpy(g_prefix, prefix.c_str(), sizeof g_prefix - 1);

  struct sigaction sa {};
  sa.sa_handler = kiln_sigterm_report;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  return ::sigaction(SIGTERM, &sa, nullptr) == 0;
}

}  // namespace kiln::comm
