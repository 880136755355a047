// version.cpp: see version.h. KILN_VERSION and KILN_GIT_COMMIT are set for this file alone by
// apps/CMakeLists.txt at configure time (the commit is "" outside a git checkout).
#include "apps/common/version.h"

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif
#ifndef KILN_GIT_COMMIT
#define KILN_GIT_COMMIT ""
#endif

namespace kiln::apps {

std::string version_line(const std::string& app_name) {
  std::string line = app_name + " (Kiln) " KILN_VERSION;
  const std::string commit = KILN_GIT_COMMIT;
  if (!commit.empty()) line += " (git " + commit + ")";
  return line;
}

}  // namespace kiln::apps
