// fault_injection.cpp: KILN_FAULT parsing and firing (see fault_injection.h).
#include "comm/fault_injection.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "engine/error.h"

namespace kiln::comm {
namespace {

const char* kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::Throw: return "throw";
    case FaultKind::Kill: return "kill";
    case FaultKind::Exit: return "exit";
  }
  return "?";
}

[[noreturn]] void bad_spec(const std::string& spec, const std::string& why) {
  throw Error("KILN_FAULT='" + spec + "': " + why + "; expected rank=R,step=S[,how=throw|kill|"
              "exit] with R >= 0 and S >= 1 (a testing aid: unset it for real runs)",
              ErrorKind::Usage);
}

int64_t parse_int(const std::string& spec, const std::string& key, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') bad_spec(spec, key + "='" + v + "' is not an integer");
  return x;
}

}  // namespace

FaultPlan parse_fault_plan(const std::string& spec) {
  FaultPlan plan;
  if (spec.empty()) return plan;
  bool has_rank = false, has_step = false;
  std::istringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) bad_spec(spec, "'" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "rank") {
      plan.rank = static_cast<int>(parse_int(spec, key, value));
      has_rank = true;
    } else if (key == "step") {
      plan.step = parse_int(spec, key, value);
      has_step = true;
    } else if (key == "how") {
      if (value == "throw") plan.kind = FaultKind::Throw;
      else if (value == "kill") plan.kind = FaultKind::Kill;
      else if (value == "exit") plan.kind = FaultKind::Exit;
      else bad_spec(spec, "how='" + value + "' is not throw, kill or exit");
    } else {
      bad_spec(spec, "unknown key '" + key + "'");
    }
  }
  if (!has_rank || !has_step) bad_spec(spec, "rank and step are both needed");
  if (plan.rank < 0 || plan.step < 1) bad_spec(spec, "out of range");
  return plan;
}

const FaultPlan& fault_plan_from_env() {
  static const FaultPlan plan = [] {
    const char* v = std::getenv("KILN_FAULT");
    return parse_fault_plan(v == nullptr ? "" : v);
  }();
  return plan;
}

void maybe_inject_fault(int rank, int64_t step) {
  const FaultPlan& plan = fault_plan_from_env();
  if (!plan.enabled() || plan.rank != rank || plan.step != step) return;
  static std::atomic<bool> fired{false};
  if (fired.exchange(true)) return;
  std::fflush(stdout);
  std::fprintf(stderr, "KILN_FAULT: rank %d dies at step %lld (%s)\n", rank,
               static_cast<long long>(step), kind_name(plan.kind));
  std::fflush(stderr);
  switch (plan.kind) {
    case FaultKind::Kill: std::raise(SIGKILL); break;
    case FaultKind::Exit: ::_exit(137);
    case FaultKind::Throw: break;
  }
  throw Error("rank " + std::to_string(rank) + " failed at step " + std::to_string(step) +
              ": injected by KILN_FAULT (a testing aid)", ErrorKind::Runtime);
}

}  // namespace kiln::comm
