#include "engine/env_switch.h"

#include <cstdlib>
#include <string>

#include "engine/error.h"

namespace kiln {

bool env_switch(const char* name, bool default_on, const char* on_means, const char* off_means) {
  const char* v = std::getenv(name);
  const std::string s = v ? v : "";
  if (s.empty()) return default_on;
  if (s == "1") return true;
  if (s == "0") return false;
  throw Error(std::string(name) + "=" + s + ": use 1 (" + on_means + ") or 0 (" + off_means + ")",
              ErrorKind::Usage);
}

}  // namespace kiln
