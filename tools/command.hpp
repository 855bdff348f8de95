// Each subcommand of `attn` lives in its own file and registers itself with the parser
// here; main() runs the one that was chosen. Adding a command means one add_*_command.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn::tools {

struct Command {
  CLI::App* app;              // the subcommand, parsed by main()
  std::function<void()> run;  // runs it with the parsed options; throws attn::Error
};

Command add_run_command(CLI::App& parent);
Command add_demo_command(CLI::App& parent);
Command add_viz_command(CLI::App& parent);

// Throws attn::Error naming `option` unless 0 <= value < count.
inline void check_index(const char* option, Index value, Index count) {
  if (value < 0 || value >= count) {
    throw Error(std::string(option) + ": expected 0 .. " + std::to_string(count - 1) + ", given " +
                std::to_string(value));
  }
}

}  // namespace attn::tools
