// Runs a shell command for the tests that drive primus-cli end to end: its exit code (-1 when it
// did not exit normally) and everything it wrote to stdout (redirect stderr in `cmd` to keep it).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace primus::test {

struct CommandResult {
  int code = -1;
  std::string out;
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace primus::test
