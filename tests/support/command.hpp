// A program run by the shell in a directory of its own, its output captured: for the tests
// of the attn command.
#pragma once

#include <string>

#include "support/temp_dir.hpp"

namespace attn::testing {

struct Outcome {
  int status = -1;  // the exit status, or 128 + the signal that ended it
  std::string out, err;
};

// Runs `command` (a shell command line) with `workdir` as the working directory; stdout and
// stderr are captured elsewhere, so that `workdir` only holds what the command wrote.
Outcome run_in(const TempDir& workdir, const std::string& command);

// text in single quotes, for a shell command line (text holds no single quote).
std::string quoted(const std::string& text);

}  // namespace attn::testing
