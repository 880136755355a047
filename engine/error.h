// error.h: the one error model of Kiln.
//
// Every check that a user can trigger (bad shapes, wrong devices, corrupt files, bad flags)
// throws kiln::Error with a message that names the thing and says what to do. Apps catch it
// at the top: exit 2 for bad usage or input (ErrorKind::Usage / ErrorKind::Input), 1 for
// runtime failures. No assert() for user-reachable conditions; these checks stay on in Release.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

enum class ErrorKind { Usage, Input, Runtime };

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorKind kind = ErrorKind::Runtime)
      : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  // The exit code an app should return for this error: 2 for usage/input, 1 otherwise.
  int exit_code() const { return kind_ == ErrorKind::Runtime ? 1 : 2; }

 private:
  ErrorKind kind_;
};

// An allocation failed (the CPU allocator, the CUDA caching allocator, the pinned host pool). A
// runtime failure (exit 1) where it is thrown; an app that knows which of its flags chose the
// sizes being allocated reports it as bad input naming them (apps/common/flag_checks.h).
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& what) : Error(what, ErrorKind::Runtime) {}
};

namespace detail {
// Streams any number of values into one string: str("shape ", s, " on ", dev).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace kiln

// KILN_CHECK(cond, msg...): throws kiln::Error(Runtime) naming the failed condition and where.
#define KILN_CHECK(cond, ...)                                                                 \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      throw ::kiln::Error(::kiln::detail::str(__VA_ARGS__, " [check `", #cond, "` at ",       \
                                              __FILE__, ":", __LINE__, "]"));                \
    }                                                                                         \
  } while (0)

// KILN_CHECK_INPUT: same, for bad user input (files, flags): apps exit with code 2.
#define KILN_CHECK_INPUT(cond, ...)                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      throw ::kiln::Error(::kiln::detail::str(__VA_ARGS__), ::kiln::ErrorKind::Input);        \
    }                                                                                         \
  } while (0)
