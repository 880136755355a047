// options.h: what comm_bench's flags hold, how they are declared (--help), and the parsers that
// turn their text into sizes, element types and thread counts.
//
// Every parser here throws a Usage error (exit 2) whose message says what to pass instead; they
// run on every rank alike before any communication (check_flags), so all ranks stop together.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace CLI {
class App;
}

namespace kiln::apps::comm_bench {

struct Options {
  std::string transport = "local:2";
  std::vector<std::string> algorithms{"ring", "hd", "bb", "ps", "native"};
  std::string min_bytes = "4K", max_bytes = "256M";
  int step_factor = 2;
  int iters = 20, warmup = 5;
  double max_seconds = 1.0;
  std::string dtype = "fp32";
  int ps_servers = 0;
  std::vector<int> ps_scaling;
  std::string ps_bytes = "4M";
  std::string ring_subchunk = "1M";
  std::string csv, json;
  bool append = false;
};

// Declares every flag on `app`, bound to `o` (the order is the order of --help).
void add_flags(CLI::App& app, Options& o);

// "4096", "4K", "4KiB", "256M", "1G" (binary: K = 1024) -> bytes.
size_t parse_bytes(const std::string& flag, const std::string& s);

// "f32" | "f16" -> the element type on the wire.
comm::ElemType parse_dtype(const std::string& s);

// "local:N" -> N; "local" -> 2; anything else -> 0.
int local_ranks(const std::string& transport);

// Flags every rank checks the same way before any communication (with check_messages_fit).
void check_flags(const Options& o);

// Messages that cannot fit in this machine's memory (--max-bytes, or --ps-bytes with
// --ps-scaling, times the ranks that are threads of this process) are bad input (exit 2).
void check_messages_fit(const Options& o);

}  // namespace kiln::apps::comm_bench
