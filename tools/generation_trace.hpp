// The demo's generation trace: a toy sequence decoded one token at a time from a KVCache,
// printed as a table and drawn as an HTML page that steps through the decode.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::tools {

// One decode step t: the new token's query against tokens 0 .. t.
struct GenerationStep {
  std::vector<double> weights;            // [t + 1] alpha over every token so far
  Tensor values;                          // [1, 1, t + 1, dim] what the cache holds
  std::vector<std::int32_t> block_table;  // the sequence's blocks after the append
};

struct GenerationTrace {
  std::vector<std::string> tokens;
  Index page_size = 0;
  std::vector<GenerationStep> steps;  // one per token
};

// tokens: n words  embeddings: [n, dim] row-major. Appends each token's embedding to a
// paged cache as key and value and decodes its query against everything so far.
GenerationTrace trace_generation(const std::vector<std::string>& tokens,
                                 const std::vector<double>& embeddings, Index dim);

// Prints which earlier token took the largest weight at each step.
void print_generation(std::ostream& out, const GenerationTrace& trace);

// The trace as a self-contained HTML page: a step control over the decode steps, and at
// each step the cache's blocks with the new query's weight on every cached token, and the
// blend of their values into the step's context.
std::string generation_page_html(const GenerationTrace& trace);

}  // namespace attn::tools
