// What a mask element does to a score, for every kernel that reads a mask: a boolean mask
// hides where it is false; an additive one hides where it is -inf and otherwise adds its
// value, in float32.
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn::core {

template <class M>
bool mask_hides(M value) {
  if constexpr (std::is_same_v<M, bool>) {
    return !value;
  } else if constexpr (std::is_same_v<M, float16> || std::is_same_v<M, bfloat16>) {
    return to_float(value) == -std::numeric_limits<float>::infinity();
  } else {
    return value == -std::numeric_limits<M>::infinity();
  }
}

// Whether the mask row leaves any of the keys [first, end) visible.
template <class M>
bool mask_shows_any(const M* row, Index first, Index end) {
  return std::any_of(row + std::min(first, end), row + end,
                     [](M value) { return !mask_hides(value); });
}

// The score once the mask element `value` is applied: -inf where it hides.
template <class M>
float masked_score(float score, M value) {
  if (mask_hides(value)) return -std::numeric_limits<float>::infinity();
  if constexpr (std::is_same_v<M, bool>) {
    return score;
  } else if constexpr (std::is_same_v<M, float16> || std::is_same_v<M, bfloat16>) {
    return score + to_float(value);
  } else {
    return score + static_cast<float>(value);
  }
}

}  // namespace attn::core
