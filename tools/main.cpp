// The attn command. Exit status: 0 on success, 2 on bad input or options (one line on
// stderr, nothing written), 1 on an internal failure.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "command.hpp"

namespace {

constexpr int kBadInput = 2;
constexpr int kInternalError = 1;

// Messages become exactly one line, however they were composed.
int report(const char* kind, std::string message, int status) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::cerr << "attn: " << kind << ": " << message << '\n';
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attn: exact attention (scores, softmax weights, context) on CPUs"};
  app.set_version_flag("--version", std::string("attn ") + attn::version);
  app.require_subcommand(1);
  const std::vector<attn::tools::Command> commands = {attn::tools::add_demo_command(app),
                                                      attn::tools::add_run_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive as "errors" that exit 0 after printing.
    if (e.get_exit_code() == 0) return app.exit(e);
    return report("error", std::string(e.what()) + " (see --help)", kBadInput);
  }
  try {
    for (const attn::tools::Command& command : commands) {
      if (command.app->parsed()) command.run();
    }
  } catch (const attn::Error& e) {
    return report("error", e.what(), kBadInput);
  } catch (const std::bad_alloc&) {
    return report("error", "out of memory for arrays of these sizes", kBadInput);
  } catch (const std::exception& e) {
    return report("internal error", e.what(), kInternalError);
  }
  return 0;
}
