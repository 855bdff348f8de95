// Which axis a list of tokens labels: self-attention has one list for both axes, and
// cross-attention labels the side whose length it matches.
#pragma once

#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::viz {

struct TokenLabels {
  std::vector<std::string> rows;     // query tokens, or empty
  std::vector<std::string> columns;  // key tokens, or empty
};

// tokens: empty, or Lq or Lk of them (both when Lq == Lk). Throws attn::Error naming
// `argument` with the counts that would fit otherwise.
TokenLabels token_labels(const std::vector<std::string>& tokens, Index len_q, Index len_k,
                         const char* argument);

// Throws attn::Error naming `argument` unless `labels` is empty or has `count` entries.
void check_label_count(const std::vector<std::string>& labels, Index count, const char* argument,
                       const char* what);

}  // namespace attn::viz
