// The demo's translation example: cross-attention from an output sentence to an input
// sentence of another length and word order, the picture that motivates attention. The
// embeddings are made by hand so that each output word's query matches the keys of the
// input words it translates.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::tools {

struct AlignmentExample {
  std::vector<std::string> source;  // the input sentence: the keys and values (Lk words)
  std::vector<std::string> target;  // the output sentence: the queries (Lq words)
  Tensor weights;                   // [1, 1, Lq, Lk] float64
};

// "the black cat is sleeping" -> "le chat noir dort": adjective and noun swap, and "dort"
// translates two words. No causal mask: every output word may look at every input word.
AlignmentExample alignment_example();

// The weights as a table, output words down and input words across, and each output
// word's strongest input word.
void print_alignment(std::ostream& out, const AlignmentExample& example);

}  // namespace attn::tools
