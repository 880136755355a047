// version.h: what `<app> --version` prints: "<app> (Kiln) 0.5.0", and the git commit the build
// was configured at when that was known ("mnist_train (Kiln) 0.5.0 (git 3dd4d62)"). The version
// is the project's (project(Kiln VERSION ...) in CMakeLists.txt); every app's --version comes
// from here (apps::parse_flags adds the flag).
#pragma once

#include <string>

namespace kiln::apps {

std::string version_line(const std::string& app_name);

}  // namespace kiln::apps
