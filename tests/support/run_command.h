// run_command.h: runs a shell command line and captures its output and exit code, for the
// tests that run a real Kiln binary (an app, an example) and check what it prints.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace kiln::testing {

struct RunResult {
  int exit_code = -1;  // -1 when the shell could not start or the command did not exit
  std::string output;  // what the command wrote to stdout (add 2>&1 for stderr too)
};

// Runs `cmd` with /bin/sh (popen), so quote each argument for the shell.
inline RunResult run_command(const std::string& cmd) {
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kiln::testing
