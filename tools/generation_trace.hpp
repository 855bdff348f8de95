// The demo's generation trace: a toy sequence decoded one token at a time from a KVCache.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::tools {

// tokens: n words  embeddings: [n, dim] row-major. Appends each token's embedding to a
// paged cache as key and value, decodes its query against everything so far, and prints
// which earlier token took the largest weight at each step.
void show_generation(std::ostream& out, const std::vector<std::string>& tokens,
                     const std::vector<double>& embeddings, Index dim);

}  // namespace attn::tools
