// Each subcommand of `attn` lives in its own file and registers itself with the parser
// here; main() runs the one that was chosen. Adding a command means one add_*_command.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <functional>
#include <iostream>
#include <limits>
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

// The exit status for bad input or options (main.cpp).
constexpr int kBadInputStatus = 2;

// Prints "attn: <kind>: <message>" on stderr as exactly one line, however the message was
// composed, in one write: under mpirun, the lines of several processes interleave write by
// write.
inline void print_error(const std::string& kind, std::string message) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::cerr << "attn: " + kind + ": " + message + '\n';
}

// Ends the command with `status` and no message of its own: what the ranks of attn run
// --distributed but rank 0 throw for an error that rank 0 prints for all of them.
struct SilentExit {
  int status;
};

// Throws attn::Error naming `option` unless 0 <= value < count.
inline void check_index(const char* option, Index value, Index count) {
  if (value < 0 || value >= count) {
    throw Error(std::string(option) + ": expected 0 .. " + std::to_string(count - 1) + ", given " +
                std::to_string(value));
  }
}

// A check that an integer option is from `low` to `high` (none: no upper bound), saying so
// in its message: CLI11's NonNegativeNumber prints its bound as 1.79769e+308.
inline CLI::Validator integer_in(Index low, Index high = std::numeric_limits<Index>::max()) {
  const std::string expected =
      high == std::numeric_limits<Index>::max()
          ? "an integer >= " + std::to_string(low)
          : "an integer from " + std::to_string(low) + " to " + std::to_string(high);
  return CLI::Validator(
      [low, high, expected](const std::string& text) {
        Index value = 0;
        const char* end = text.data() + text.size();
        const auto parsed = std::from_chars(text.data(), end, value);
        if (parsed.ec == std::errc() && parsed.ptr == end && value >= low && value <= high) {
          return std::string();
        }
        return "expected " + expected + ", given '" + text + "'";
      },
      "");
}

}  // namespace attn::tools
