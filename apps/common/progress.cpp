// progress.cpp: see progress.h.
#include "apps/common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "apps/common/launcher.h"

namespace kiln::apps {

// Under mpirun, Open MPI hands each rank a pseudo-terminal even when mpirun's own output goes
// to a file, so isatty() says yes and a log would fill with progress-bar redraws: plain lines.
bool stdout_is_tty() {
  return isatty(fileno(stdout)) == 1 && !launched_by_mpi();
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0)) seconds = 0;  // also catches NaN
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      enabled_(enabled && stdout_is_tty()),
      start_(Clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() { clear(); }

void ProgressBar::update(int64_t done, double loss, double items_per_sec) {
  if (!enabled_) return;
  const auto now = Clock::now();
  const bool finished = done >= total_;
  if (!finished && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;

  constexpr int kWidth = 20;
  const double frac = std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '-');
  // ETA from the average pace so far: steady after the first few steps, unlike the last rate.
  const double elapsed = seconds_since(start_);
  const double eta = done > 0 ? elapsed * static_cast<double>(total_ - done) / done : 0.0;
  std::printf("\r%s [%s] %5lld/%lld  loss %.4f  %6.0f img/s  ETA %s\033[K", label_.c_str(),
              bar.c_str(), static_cast<long long>(done), static_cast<long long>(total_), loss,
              items_per_sec, format_duration(eta).c_str());
  std::fflush(stdout);
  drawn_ = true;
}

std::string count_of(long long n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

void ProgressBar::clear() {
  if (!drawn_) return;
  std::printf("\r\033[K");  // carriage return, then erase to the end of the line
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace kiln::apps
