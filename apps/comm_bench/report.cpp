// report.cpp: see report.h.
#include "apps/comm_bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "apps/comm_bench/options.h"
#include "engine/error.h"
#include "engine/output_file.h"

namespace kiln::apps::comm_bench {

std::string human_bytes(double b) {
  char buf[32];
  if (b >= (1 << 30)) std::snprintf(buf, sizeof buf, "%g GiB", b / (1 << 30));
  else if (b >= (1 << 20)) std::snprintf(buf, sizeof buf, "%g MiB", b / (1 << 20));
  else if (b >= (1 << 10)) std::snprintf(buf, sizeof buf, "%g KiB", b / (1 << 10));
  else std::snprintf(buf, sizeof buf, "%g B", b);
  return buf;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string bytes_str(double b) {
  return b == std::floor(b) ? fmt("%.0f", b) : fmt("%.1f", b);
}

void write_json_report(const Options& o, const Report& report) {
  const nlohmann::json j = {{"transport", o.transport}, {"dtype", o.dtype},
                           {"results", report.rows}};
  write_output_file("--json", o.json, j.dump(2) + "\n");
}

std::string host_note(const comm::Transport& t) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::string s;
  if (std::string(t.name()) == "local") {
    s = "local: the ranks are threads of this process and a send is a memcpy into the peer's "
        "mailbox, so these times measure memory copies and how " +
        std::to_string(t.size()) + " threads share " + std::to_string(cores) +
        " core(s), not a network";
  } else if (t.local_size() == t.size()) {
    s = std::string(t.name()) + ": all " + std::to_string(t.size()) + " ranks on one host (" +
        t.host() + ", " + std::to_string(cores) + " cores): " +
        (std::string(t.name()) == "mpi" ? "Open MPI moves the bytes through shared memory, so "
                                          "these times measure memory copies, not a network"
                                        : "GPU to GPU inside one machine");
  } else {
    s = std::string(t.name()) + ": " + std::to_string(t.size()) + " ranks, " +
        std::to_string(t.local_size()) + " on this host (" + t.host() + ")";
  }
  if (static_cast<unsigned>(t.local_size()) > cores && !t.device().is_cuda()) {
    s += "; more ranks than cores on this host: ranks wait for a core, times are pessimistic";
  }
  return s;
}

}  // namespace kiln::apps::comm_bench
