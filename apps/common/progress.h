// progress.h: the terminal progress bar and timing helpers shared by the apps.
//
// On a terminal (stdout is a TTY) an app redraws one line in place with '\r':
//
//   epoch 3/14 [##########----------]  234/469  loss 0.0412  1712 img/s  ETA 0:07
//
// Anywhere else (a pipe, a CI log, a file) the bar prints nothing at all, so logs hold only
// the apps' plain one-line-per-epoch summaries instead of thousands of carriage returns.
// Redraws are rate-limited (10 per second) so drawing never shows up in a profile.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::apps {

// Seconds on a monotonic clock since `start` was taken.
using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// True when stdout is a terminal.
bool stdout_is_tty();

// "1:05" / "1:02:05": a duration for humans.
std::string format_duration(double seconds);

// The median of a non-empty list (the mean of the two middle values for an even count);
// 0 for an empty list.
double median(std::vector<double> values);

// "1 worker", "2 workers", "0 workers": a count and its noun, singular for exactly one (the
// plural adds an s: the nouns the apps count are regular).
std::string count_of(long long n, const std::string& noun);

class ProgressBar {
 public:
  // `label` prefixes the line ("epoch 3/14"); `total` steps make 100%. `enabled` false (or
  // stdout not a TTY) turns every call into a no-op.
  ProgressBar(std::string label, int64_t total, bool enabled);
  ~ProgressBar();  // clears the line if it was drawn
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Records that `done` of `total` steps are complete; `loss` and `items_per_sec` are shown
  // as they are. Draws at most every 100 ms (and always at done == total).
  void update(int64_t done, double loss, double items_per_sec);
  // Erases the bar so the caller can print its summary line in its place.
  void clear();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_;
  Clock::time_point last_draw_;
};

}  // namespace kiln::apps
