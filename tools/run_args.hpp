// The options of `attn run`, parsed, and what both of its forms (one process, and
// --distributed over MPI ranks) make of them alike.
#pragma once

#include <optional>
#include <string>

#include "attn/options.hpp"
#include "compute_options.hpp"

namespace attn::tools {

struct RunArgs {
  std::string query, key, value, out;
  std::string weights, lse, mask, alibi, sinks;  // empty: not given
  std::string contributions;                     // empty: not written
  bool causal = false;
  std::string causal_align;  // "top-left", "bottom-right", or empty (top-left)
  std::optional<double> scale;
  std::string window;  // "L,R"; empty: off
  double softcap = 0.0;
  std::string layout = "bhsd";
  ComputeOptions compute;
  std::string viz, viz_tokens;       // empty: no picture, no labels
  std::string viz_show = "weights";  // or "contributions"
  Index viz_head = 0;
  bool quiet = false;
  bool distributed = false;
  std::string sharding;  // "contiguous", "zigzag", or empty (contiguous)
};

// "L,R" with integers >= -1 (-1: unbounded on that side).
std::optional<Window> parse_window(const std::string& text);

// Every option but the mask, which is an array read with the inputs; ALiBi slopes and sinks
// are read from their files.
Options options_without_mask(const RunArgs& args);

// Two outputs at one path would silently keep only the last; an output that is a directory
// or a device is refused before any work.
void check_outputs(const RunArgs& args);

}  // namespace attn::tools
