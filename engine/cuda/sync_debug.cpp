// sync_debug.cpp: the sync debug mode, the allowances and the reports (see sync_debug.h).
#include "engine/cuda/sync_debug.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "engine/error.h"

namespace kiln::cuda {
namespace {

// kUnread: KILN_SYNC_DEBUG not read yet; kInvalid: it holds something else than a mode.
constexpr int kUnread = -1;
constexpr int kInvalid = -2;
std::atomic<int> g_mode{kUnread};

int resolved() {
  int v = g_mode.load(std::memory_order_relaxed);
  if (v != kUnread) return v;
  const char* env = std::getenv("KILN_SYNC_DEBUG");
  try {
    v = static_cast<int>(parse_sync_debug(env ? env : ""));
  } catch (const Error&) {
    v = kInvalid;
  }
  int expected = kUnread;
  if (!g_mode.compare_exchange_strong(expected, v)) v = expected;  // a setter won the race
  return v;
}

// Kiln's source root, from this file's own path: call sites inside the tree print relative to
// it ("apps/mnist/train_loop.cpp:50"), others in full.
std::string_view source_root() {
  constexpr std::string_view self = __FILE__;
  constexpr std::string_view tail = "engine/cuda/sync_debug.cpp";
  if (self.size() < tail.size() || self.substr(self.size() - tail.size()) != tail) return {};
  return self.substr(0, self.size() - tail.size());
}

std::string_view relative(const char* file) {
  std::string_view f = file != nullptr ? file : "(unknown file)";
  const std::string_view root = source_root();
  if (!root.empty() && f.substr(0, root.size()) == root) f.remove_prefix(root.size());
  return f;
}

std::string report_text(const SyncSite& site) {
  std::string what;
  if (site.what != nullptr) what = site.what;
  if (site.how != nullptr) what += what.empty() ? site.how : std::string(" (") + site.how + ")";
  if (what.empty()) what = "a call";
  return "kiln: sync debug: " + what + " waits for the device at " +
         std::string(relative(site.file)) + ":" + std::to_string(site.line);
}

// The reported sites, the named waits and the counts. Never destroyed: destructors of other
// static objects (allocator caches, thread streams) may still wait, and check, while the
// program exits.
struct Reports {
  std::mutex mu;
  struct Site {
    std::string text;
    int64_t waits = 0;
  };
  std::map<std::pair<std::string, int>, Site> sites;  // (file, line) -> report
  std::map<std::string, int64_t> named;               // AllowSync reason -> waits
  std::atomic<int64_t> checked{0}, allowed{0}, reported{0};
  std::once_flag summary_registered;
};

Reports& reports() {
  static Reports* r = new Reports();
  return *r;
}

// At exit, in warn mode: how often each named reason and each reported site waited, so that a
// wait of the steady state (one a step) stands out from a wait of the setup (once).
void print_summary() {
  if (g_mode.load(std::memory_order_relaxed) != static_cast<int>(SyncDebug::Warn)) return;
  Reports& r = reports();
  std::lock_guard<std::mutex> lock(r.mu);
  std::fprintf(stderr, "kiln: sync debug: %lld waits for the device: %lld named, %lld reported\n",
               static_cast<long long>(r.checked.load()), static_cast<long long>(r.allowed.load()),
               static_cast<long long>(r.reported.load()));
  for (const auto& [why, waits] : r.named) {
    std::fprintf(stderr, "kiln: sync debug: %8lld x named: %s\n", static_cast<long long>(waits),
                 why.c_str());
  }
  constexpr std::string_view prefix = "kiln: sync debug: ";
  for (const auto& [key, s] : r.sites) {
    const std::string_view body = std::string_view(s.text).substr(prefix.size());
    std::fprintf(stderr, "kiln: sync debug: %8lld x %.*s\n", static_cast<long long>(s.waits),
                 static_cast<int>(body.size()), body.data());
  }
}

void register_summary(Reports& r) {
  std::call_once(r.summary_registered, [] { std::atexit(print_summary); });
}

// Counts a reported wait at `site`; true the first time the site is seen.
bool add_report(const SyncSite& site, const std::string& text) {
  Reports& r = reports();
  r.reported.fetch_add(1, std::memory_order_relaxed);
  register_summary(r);
  std::lock_guard<std::mutex> lock(r.mu);
  Reports::Site& s = r.sites[{std::string(relative(site.file)), site.line}];
  const bool first = s.waits == 0;
  if (first) s.text = text;
  ++s.waits;
  return first;
}

void add_named(const char* why) {
  Reports& r = reports();
  r.allowed.fetch_add(1, std::memory_order_relaxed);
  register_summary(r);
  std::lock_guard<std::mutex> lock(r.mu);
  ++r.named[why];
}

thread_local const char* t_allowance = nullptr;

// The check. may_throw false: error mode prints instead of throwing.
void check(const SyncSite& site, bool may_throw) {
  int mode = resolved();
  if (mode == static_cast<int>(SyncDebug::Off)) return;
  if (mode == kInvalid) {
    if (may_throw) (void)sync_debug_mode();  // throws the Usage error
    mode = static_cast<int>(SyncDebug::Warn);
  }
  Reports& r = reports();
  r.checked.fetch_add(1, std::memory_order_relaxed);
  if (t_allowance != nullptr) {
    add_named(t_allowance);
    return;
  }
  std::string text = report_text(site);
  const bool first = add_report(site, text);
  if (mode == static_cast<int>(SyncDebug::Error)) {
    if (may_throw && std::uncaught_exceptions() == 0) {
      throw Error(text + " (KILN_SYNC_DEBUG=error: remove the wait, or name it with "
                         "cuda::AllowSync; docs/cuda.md)",
                  ErrorKind::Runtime);
    }
    text += " (not thrown: a path that must not throw)";
  }
  if (first) std::fprintf(stderr, "%s\n", text.c_str());
}

}  // namespace

SyncDebug parse_sync_debug(const char* text) {
  const std::string s = text != nullptr ? text : "";
  if (s.empty() || s == "off" || s == "0" || s == "default") return SyncDebug::Off;
  if (s == "warn" || s == "1") return SyncDebug::Warn;
  if (s == "error" || s == "2") return SyncDebug::Error;
  throw Error("KILN_SYNC_DEBUG=" + s +
                  " is not a sync debug mode: use off, warn or error (or 0, 1, 2)",
              ErrorKind::Usage);
}

SyncDebug sync_debug_mode() {
  const int v = resolved();
  if (v == kInvalid) return parse_sync_debug(std::getenv("KILN_SYNC_DEBUG"));  // throws
  return static_cast<SyncDebug>(v);
}

void set_sync_debug_mode(SyncDebug mode) {
  g_mode.store(static_cast<int>(mode), std::memory_order_relaxed);
}

const char* sync_debug_name(SyncDebug mode) {
  switch (mode) {
    case SyncDebug::Off: return "off";
    case SyncDebug::Warn: return "warn";
    case SyncDebug::Error: return "error";
  }
  return "?";
}

AllowSync::AllowSync(const char* why) noexcept : previous_(t_allowance) {
  t_allowance = why != nullptr && *why != '\0' ? why : "(unnamed)";
}

AllowSync::~AllowSync() { t_allowance = previous_; }

bool sync_allowed() { return t_allowance != nullptr; }
const char* sync_allowance() { return t_allowance; }

void check_sync(SyncSite site) { check(site, /*may_throw=*/true); }

void check_sync_nothrow(SyncSite site) noexcept {
  try {
    check(site, /*may_throw=*/false);
  } catch (...) {
    // Out of memory formatting the report: the wait goes on unreported.
  }
}

SyncDebugCounts sync_debug_counts() {
  Reports& r = reports();
  SyncDebugCounts c;
  c.checked = r.checked.load();
  c.allowed = r.allowed.load();
  c.reported = r.reported.load();
  std::lock_guard<std::mutex> lock(r.mu);
  c.sites = static_cast<int64_t>(r.sites.size());
  return c;
}

void reset_sync_debug_counts() {
  Reports& r = reports();
  std::lock_guard<std::mutex> lock(r.mu);
  r.sites.clear();
  r.named.clear();
  r.checked = 0;
  r.allowed = 0;
  r.reported = 0;
}

}  // namespace kiln::cuda
