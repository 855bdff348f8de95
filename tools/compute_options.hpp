// --backend and --threads: the options of every command that computes attention (run,
// demo, and later bench), declared once so their names, help and checks agree.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "attn/options.hpp"

namespace attn::tools {

struct ComputeOptions {
  std::string backend = "auto";
  int threads = 0;
};

// `scope` prefixes the help text, e.g. "Part 2: ".
void add_compute_options(CLI::App& app, ComputeOptions& options, const std::string& scope = "");

// Applies the parsed values to the library's options.
void apply(const ComputeOptions& compute, Options& options);

}  // namespace attn::tools
