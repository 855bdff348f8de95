#include "viz/tokens.hpp"

namespace attn::viz {

TokenLabels token_labels(const std::vector<std::string>& tokens, Index len_q, Index len_k,
                         const char* argument) {
  const auto count = static_cast<Index>(tokens.size());
  if (!tokens.empty() && count != len_q && count != len_k) {
    const std::string expected = len_q == len_k ? std::to_string(len_q)
                                                : std::to_string(len_q) + " (one per query) or " +
                                                      std::to_string(len_k) + " (one per key)";
    throw Error(std::string(argument) + ": expected " + expected + " tokens, given " +
                std::to_string(count));
  }
  TokenLabels labels;
  if (count == len_q) labels.rows = tokens;
  if (count == len_k) labels.columns = tokens;
  return labels;
}

void check_label_count(const std::vector<std::string>& labels, Index count, const char* argument,
                       const char* what) {
  if (labels.empty() || static_cast<Index>(labels.size()) == count) return;
  throw Error(std::string(argument) + ": expected " + std::to_string(count) + " tokens (one per " +
              what + "), given " + std::to_string(labels.size()));
}

}  // namespace attn::viz
