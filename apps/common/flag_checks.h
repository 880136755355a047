// flag_checks.h: what every Kiln app does with its flags' errors, in words a user can act on.
//
//   app.add_option("--epochs", o.epochs, "...")->check(apps::at_least(1));
//       mnist_train --epochs 0      ->  mnist_train: error: --epochs must be at least 1 (got 0)
//   app.add_option("--lr", o.lr, "...")->check(apps::above(0.0));
//       mnist_train --lr -1         ->  mnist_train: error: --lr must be > 0 (got -1)
//   app.add_option("--precision", o.precision, "...")->check(apps::one_of({"fp32", "bf16"}));
//       mnist_train --precision fp64  ->  ... --precision must be one of fp32, bf16 (got fp64)
//
// These replace CLI11's own range and set validators, whose text names the type's limits
// ("Value 0 not in range 0.000000 to 1797693134862315708...") instead of what to pass. A
// validator sees the flag's text before CLI11 converts it, so it also says "must be a whole
// number" for "2.5" and "must be at most 2147483647" where an int would overflow.
//
// parse_flags() runs CLI11 and prints its errors as "<app>: error: <message>" with a pointer to
// --help (unknown flags, missing values keep CLI11's wording). It also makes writes past the
// file-size limit fail with EFBIG rather than kill the app (engine/output_file.h). The exit
// codes of every app (docs/architecture.md): 0 ok (and --help), 2 bad usage or bad input, 1 a
// runtime failure.
//
// Sizes: check_fits_in_memory() refuses before any allocation a flag whose buffers cannot fit
// in this machine's memory, and size_error() turns an out-of-memory error (kiln::OutOfMemory)
// raised while the flags' sizes are being allocated into bad input naming those flags.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "apps/common/flag_names.h"
#include "engine/error.h"

namespace kiln::apps {

namespace flag_text {
// The checks behind the validators: "" when `text` passes, else the message after the flag's
// name ("must be at least 1 (got 0)"). Whole numbers are checked as integers (no rounding);
// reals must be finite. `hi_is_type_limit`: the upper bound is only the type's, so the message
// for a number below `lo` says "at least" rather than "between".
std::string check_whole(const std::string& text, long long lo, long long hi, bool hi_is_type_limit);
std::string check_real(const std::string& text, double lo, bool lo_open, double hi,
                       bool hi_is_type_limit);
std::string check_member(const std::string& text, const std::vector<std::string>& choices);
// Any whole number in [0, hi] for an unsigned flag: digits only, so that "-1" (which strtoull
// and CLI11 wrap to 2^64 - 1) and a number past `hi` (which CLI11 saturates) are refused.
std::string check_unsigned(const std::string& text, unsigned long long hi);

template <typename T>
CLI::Validator number_validator(T lo, T hi, bool lo_open, bool hi_is_type_limit,
                                const std::string& description) {
  static_assert(std::is_arithmetic_v<T>, "numeric flags only");
  return CLI::Validator(
      [=](std::string& text) {
        if constexpr (std::is_integral_v<T>) {
          // An unsigned type's maximum does not fit in long long: clamp it, never wrap it.
          constexpr auto kMax =
              static_cast<unsigned long long>(std::numeric_limits<long long>::max());
          const long long top = static_cast<unsigned long long>(hi) > kMax
                                    ? static_cast<long long>(kMax)
                                    : static_cast<long long>(hi);
          return check_whole(text, static_cast<long long>(lo), top, hi_is_type_limit);
        } else {
          return check_real(text, static_cast<double>(lo), lo_open, static_cast<double>(hi),
                            hi_is_type_limit);
        }
      },
      description);
}
std::string bound_text(double v);
}  // namespace flag_text

// A number >= min (whole numbers for integer T: at_least(1) for an int flag,
// at_least(int64_t{1}) for an int64_t one, at_least(0.0) for a double).
template <typename T>
CLI::Validator at_least(T min) {
  return flag_text::number_validator<T>(min, std::numeric_limits<T>::max(), false, true,
                                        ">= " + flag_text::bound_text(static_cast<double>(min)));
}

// A real number > min (a learning rate: above(0.0)).
inline CLI::Validator above(double min) {
  return flag_text::number_validator<double>(min, std::numeric_limits<double>::max(), true, true,
                                             "> " + flag_text::bound_text(min));
}

// A number in [lo, hi] (whole numbers for integer T).
template <typename T>
CLI::Validator in_range(T lo, T hi) {
  return flag_text::number_validator<T>(lo, hi, false, false,
                                        flag_text::bound_text(static_cast<double>(lo)) + ".." +
                                            flag_text::bound_text(static_cast<double>(hi)));
}

// One of `choices`, spelled exactly.
CLI::Validator one_of(std::vector<std::string> choices);

// Any value of the unsigned type T (a seed: any_unsigned<uint64_t>()), refusing what CLI11
// would wrap or saturate silently:
//   mnist_train --seed -1  ->  --seed must be a whole number between 0 and 18446744073709551615
//                              (got -1)
template <typename T>
CLI::Validator any_unsigned() {
  static_assert(std::is_unsigned_v<T>, "unsigned flags only");
  const unsigned long long hi = std::numeric_limits<T>::max();
  return CLI::Validator(
      [hi](std::string& text) { return flag_text::check_unsigned(text, hi); },
      "0.." + std::to_string(hi));
}

// A path given explicitly must not be empty: `--json ""` is a mistake (a variable that was never
// set), not a request for no output. "--json needs a file name". `what`: "a file name",
// "a directory name".
CLI::Validator non_empty_path(const std::string& what = "a file name");

// parse_flags() puts non_empty_path() on every option of these names that an app declares
// (inputs and outputs: --data, --resume, --json, --csv, --trace, --checkpoint, --out), so that
// every app refuses an empty path the same way, and a new app's path flags need no code.
struct PathFlag {
  const char* name;
  const char* what;  // "a file name" | "a directory name"
};
const std::vector<PathFlag>& path_flags();

// Parses argv with CLI11. Returns the exit code when the app must stop now: 0 after --help or
// --version (added here for every app: version.h), 2 after a flag error (printed as
// "<app>: error: ..." plus a pointer to --help); nullopt when parsing succeeded. The app's
// `old_spellings` are rewritten first, each with a line saying what to write instead
// (flag_names.h). Under mpirun, rank 0 alone prints (every rank finds the same error).
std::optional<int> parse_flags(CLI::App& app, int argc, char** argv, const char* app_name,
                               const std::vector<OldSpelling>& old_spellings = {});

// Bad input (exit 2), before anything is allocated, when `bytes` (what `flag`, given as `value`,
// makes one buffer need; a double, so that absurd values do not overflow) exceed this machine's
// physical memory: "--batch-size 100000000: one batch of 28x28 f32 images would need 292 GiB, more
// than this machine's 23 GiB of memory: lower --batch-size". `what` names the buffer. A lower
// bound of what a run needs is enough: it catches the sizes that cannot work at all, without
// an allocation that the kernel's overcommit would grant and the OOM killer end.
void check_fits_in_memory(const std::string& flag, const std::string& value, double bytes,
                          const std::string& what);

// The error to throw when an allocation ran out of memory while the sizes chosen by `flags`
// (e.g. "--batch-size 128 --image-size 224") were being allocated: bad input (exit 2) that
// keeps the allocator's numbers and says which flags to lower.
Error size_error(const OutOfMemory& oom, const std::string& flags);

// The machine's physical memory in bytes (0 when it cannot be read).
int64_t physical_memory_bytes();

// "292 GiB", "1.5 MiB": bytes for a message.
std::string human_bytes(double bytes);

}  // namespace kiln::apps
