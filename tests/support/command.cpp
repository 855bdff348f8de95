#include "support/command.hpp"

#include <sys/wait.h>

#include <cstdlib>

namespace attn::testing {

std::string quoted(const std::string& text) {
  return "'" + text + "'";
}

Outcome run_in(const TempDir& workdir, const std::string& command) {
  const TempDir logs;
  const std::string line = "cd " + quoted(workdir.path().string()) + " && " + command + " >" +
                           quoted(logs.file("out")) + " 2>" + quoted(logs.file("err"));
  const int raw = std::system(line.c_str());
  Outcome outcome;
  outcome.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  outcome.out = logs.read("out");
  outcome.err = logs.read("err");
  return outcome;
}

}  // namespace attn::testing
