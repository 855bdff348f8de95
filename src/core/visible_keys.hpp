// The keys that causal masking and the sliding window leave to a query: one rule for the
// forward, weights and decode kernels.
#pragma once

#include <algorithm>

#include "attn/options.hpp"

namespace attn::core {

struct KeyRange {
  Index first = 0, end = 0;  // 0 <= first <= end <= len_k; first == end when none is left
};

// Keys [first, end) of [0, len_k) visible to a query at key position `position`.
inline KeyRange visible_keys(bool causal, const Window& window, Index position, Index len_k) {
  KeyRange keys{0, len_k};
  if (causal) keys.end = std::min(keys.end, position + 1);
  if (window.left >= 0) keys.first = std::max(keys.first, position - window.left);
  if (window.right >= 0) keys.end = std::min(keys.end, position + window.right + 1);
  keys.first = std::min(keys.first, len_k);
  keys.end = std::max(keys.end, keys.first);
  return keys;
}

}  // namespace attn::core
