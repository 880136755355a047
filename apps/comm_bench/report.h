// report.h: what comm_bench writes besides its table: the number formats the table and the CSV
// share, the CSV file (rank 0), the JSON rows (--json), and the note that says what the
// measured times measure on this machine.
//
// CSV (--csv PATH; --append adds rows below an existing header). Written by rank 0. The column
// lists are kSweepCsvHeader and kPsScalingCsvHeader; tools/plot.py reads the columns by name,
// tools/comm_experiment.sh by position: change them together.
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/common/csv_out.h"
#include "comm/transport.h"

namespace kiln::apps::comm_bench {

struct Options;

constexpr const char* kSweepCsvHeader =
    "transport,world,members,ps_servers,algorithm,dtype,bytes,count,iters,time_us,"
    "algbw_gbs,busbw_gbs,bytes_per_rank,bytes_per_rank_max,bytes_total,"
    "model_bytes_per_rank,correct,median_us";
constexpr const char* kPsScalingCsvHeader =
    "transport,workers,servers,algorithm,dtype,bytes,iters,time_us,worker_bytes_sent,"
    "server_bytes_received,model_worker_bytes,model_server_bytes_received,correct,"
    "median_us";

// 4096 -> "4 KiB", 1.5 * 2^20 -> "1.5 MiB" (%g of the largest binary unit that fits).
std::string human_bytes(double b);

// printf of one number into a string.
std::string fmt(const char* f, double v);

// The bytes column: an integer when it is one, else one decimal.
std::string bytes_str(double b);


// What rank 0 collects while the ranks run (the local transport's rank 0 is a thread).
struct Report {
  CsvOut csv;  // rank 0 opens it; other ranks hold a closed one
  nlohmann::json rows = nlohmann::json::array();
  bool all_correct = true;
};

// --json: the transport, the dtype and every row rank 0 collected.
void write_json_report(const Options& o, const Report& report);

// One line on what these times measure here: threads sharing cores, shared memory between
// processes of one host, or a real network; and whether the ranks outnumber the cores.
std::string host_note(const comm::Transport& t);

}  // namespace kiln::apps::comm_bench
