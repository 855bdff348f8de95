// The attn command. Exit status: 0 on success, 2 on bad input or options (one line on
// stderr, nothing written), 1 on an internal failure, 128 + the signal number on SIGINT or
// SIGTERM (unfinished files removed).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "command.hpp"
#include "io/staged_file.hpp"

namespace {

constexpr int kBadInput = attn::tools::kBadInputStatus;
constexpr int kInternalError = 1;

int report(const char* kind, const std::string& message, int status) {
  attn::tools::print_error(kind, message);
  return status;
}

bool is_command(CLI::App& app, const std::string& name) {
  return !app.get_subcommands([&](CLI::App* command) { return command->check_name(name); }).empty();
}

// CLI11 reports a misspelt command as a missing one; name it instead.
std::string unknown_command(CLI::App& app, const std::string& given) {
  std::string known;
  for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; })) {
    known += (known.empty() ? "" : ", ") + command->get_name();
  }
  return "unknown command '" + given + "': expected one of " + known + " (see --help)";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attn: exact attention (scores, softmax weights, context) on CPUs"};
  app.set_version_flag("--version", std::string("attn ") + attn::version);
  app.require_subcommand(1);
  const std::vector<attn::tools::Command> commands = {attn::tools::add_demo_command(app),
                                                      attn::tools::add_run_command(app),
                                                      attn::tools::add_viz_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive as "errors" that exit 0 after printing.
    if (e.get_exit_code() == 0) return app.exit(e);
    if (argc > 1 && argv[1][0] != '-' && !is_command(app, argv[1])) {
      return report("error", unknown_command(app, argv[1]), kBadInput);
    }
    return report("error", std::string(e.what()) + " (see --help)", kBadInput);
  }
  attn::io::remove_staged_files_on_signals();
  try {
    for (const attn::tools::Command& command : commands) {
      if (command.app->parsed()) command.run();
    }
  } catch (const attn::tools::SilentExit& e) {
    return e.status;
  } catch (const attn::Error& e) {
    return report("error", e.what(), kBadInput);
  } catch (const std::bad_alloc&) {
    return report("error", "out of memory for arrays of these sizes", kBadInput);
  } catch (const std::exception& e) {
    return report("internal error", e.what(), kInternalError);
  }
  return 0;
}
