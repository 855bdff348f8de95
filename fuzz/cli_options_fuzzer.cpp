// The attn command's options on arbitrary arguments (the input split at NUL bytes): the
// parser and every check on option text (--window L,R, --causal[=ALIGN], --layout,
// --threads, --backend, ...) must accept or throw CLI::ParseError, never crash. Only the
// parsing runs; no command does.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "command.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> arguments{"attn"};
  std::string argument;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == '\0') {
      arguments.push_back(argument);
      argument.clear();
    } else {
      argument.push_back(static_cast<char>(data[i]));
    }
  }
  if (size > 0) arguments.push_back(argument);
  std::vector<const char*> argv;
  for (const std::string& a : arguments) argv.push_back(a.c_str());

  // As main() builds it; the commands own the variables their options parse into.
  CLI::App app{"attn"};
  app.set_version_flag("--version", "attn");
  app.require_subcommand(1);
  const std::vector<attn::tools::Command> commands = {attn::tools::add_demo_command(app),
                                                      attn::tools::add_run_command(app),
                                                      attn::tools::add_viz_command(app)};
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
  }
  return 0;
}
