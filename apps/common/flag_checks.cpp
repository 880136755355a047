// flag_checks.cpp: see flag_checks.h.
#include "apps/common/flag_checks.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "apps/common/launcher.h"
#include "apps/common/version.h"
#include "engine/output_file.h"

namespace kiln::apps {

namespace flag_text {

std::string bound_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

namespace {
std::string got(const std::string& text) { return " (got " + text + ")"; }
}  // namespace

std::string check_whole(const std::string& text, long long lo, long long hi,
                        bool hi_is_type_limit) {
  const std::string range = hi_is_type_limit
                                ? "at least " + std::to_string(lo)
                                : "between " + std::to_string(lo) + " and " + std::to_string(hi);
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0') {
    return "must be a whole number, " + range + got(text);  // "2.5", "1e3", "abc"
  }
  if (errno == ERANGE && v < 0) return "must be " + range + got(text);
  if (errno == ERANGE || v > hi) {
    return hi_is_type_limit ? "must be at most " + std::to_string(hi) + got(text)
                            : "must be " + range + got(text);
  }
  if (v < lo) return "must be " + range + got(text);
  return "";
}

std::string check_real(const std::string& text, double lo, bool lo_open, double hi,
                       bool hi_is_type_limit) {
  const std::string range =
      hi_is_type_limit ? (lo_open ? "> " + bound_text(lo) : "at least " + bound_text(lo))
                       : "between " + bound_text(lo) + " and " + bound_text(hi);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0' || !std::isfinite(v)) {
    return "must be a number, " + range + got(text);
  }
  if (v < lo || (lo_open && v == lo) || v > hi) return "must be " + range + got(text);
  return "";
}

std::string check_member(const std::string& text, const std::vector<std::string>& choices) {
  for (const std::string& c : choices) {
    if (c == text) return "";
  }
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) list += (i > 0 ? ", " : "") + choices[i];
  return "must be one of " + list + got(text);
}

std::string check_unsigned(const std::string& text, unsigned long long hi) {
  const std::string message =
      "must be a whole number between 0 and " + std::to_string(hi) + got(text);
  if (text.empty() || text.size() > 20) return message;
  for (char c : text) {
    if (c < '0' || c > '9') return message;  // a sign, a point, a space: not a plain count
  }
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v > hi) return message;
  return "";
}

}  // namespace flag_text

CLI::Validator one_of(std::vector<std::string> choices) {
  std::string description = "{";
  for (size_t i = 0; i < choices.size(); ++i) description += (i > 0 ? "," : "") + choices[i];
  description += "}";
  return CLI::Validator(
      [choices = std::move(choices)](std::string& text) {
        return flag_text::check_member(text, choices);
      },
      description);
}

CLI::Validator non_empty_path(const std::string& what) {
  return CLI::Validator(
      [what](std::string& text) { return text.empty() ? "needs " + what : std::string(); },
      "PATH");
}

const std::vector<PathFlag>& path_flags() {
  static const std::vector<PathFlag> flags = {
      {"--data", "a directory name"}, {"--out", "a directory name"},
      {"--resume", "a file name"},    {"--checkpoint", "a file name"},
      {"--json", "a file name"},      {"--csv", "a file name"},
      {"--trace", "a file name"},
  };
  return flags;
}

namespace {

// CLI11 words a validator's failure as "<flag>: <message>"; ours read as one sentence
// ("--epochs must be at least 1 (got 0)", "--json needs a file name"), so the colon goes.
std::string error_text(const CLI::Error& e) {
  std::string text = e.what();
  if (e.get_name() == "ValidationError" && text.rfind("-", 0) == 0) {
    for (const char* verb : {": must ", ": needs "}) {
      const size_t colon = text.find(verb);
      if (colon != std::string::npos) {
        text.erase(colon, 1);
        break;
      }
    }
  }
  return text;
}

// non_empty_path() on every path option of path_flags() the app declares.
void check_paths_not_empty(CLI::App& app) {
  for (const PathFlag& f : path_flags()) {
    if (CLI::Option* opt = app.get_option_no_throw(f.name)) opt->check(non_empty_path(f.what));
  }
}

}  // namespace

std::optional<int> parse_flags(CLI::App& app, int argc, char** argv, const char* app_name,
                               const std::vector<OldSpelling>& old_spellings) {
  // Every app starts here: from now on a write past the file-size limit (ulimit -f) fails with
  // EFBIG, reported in words naming the file (exit 1), instead of SIGXFSZ killing the process.
  ignore_file_size_signal();
  check_paths_not_empty(app);
  app.set_version_flag("--version", version_line(app_name), "print the app's name, Kiln's version "
                       "and the build's git commit, and exit");
  std::vector<std::string> args =
      rewrite_old_spellings(argc, argv, old_spellings, app_name, launched_as_nonzero_rank());
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::ParseError& e) {
    const bool say = !launched_as_nonzero_rank();
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      if (say) app.exit(e);  // --help
      return 0;
    }
    if (say) {
      std::cout.flush();
      std::cerr << app_name << ": error: " << error_text(e) << "\n"
                << "Run " << app_name << " --help for the flags and their ranges.\n";
    }
    return 2;
  }
  return std::nullopt;
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  double v = bytes;
  int u = 0;
  while (v >= 1024 && u < 8) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 || v >= 100 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

void check_fits_in_memory(const std::string& flag, const std::string& value, double bytes,
                          const std::string& what) {
  const int64_t total = physical_memory_bytes();
  if (total <= 0 || bytes <= static_cast<double>(total)) return;
  throw Error(flag + " " + value + ": " + what + " would need " + human_bytes(bytes) +
                  ", more than this machine's " + human_bytes(static_cast<double>(total)) +
                  " of memory: lower " + flag,
              ErrorKind::Input);
}

Error size_error(const OutOfMemory& oom, const std::string& flags) {
  return Error("the sizes chosen by " + flags + " do not fit in memory: lower them (" +
                   oom.what() + ")",
               ErrorKind::Input);
}

}  // namespace kiln::apps
