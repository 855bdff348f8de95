// The position bias as the kernels read it: checked once, then laid out per head by
// key - query offset, so that a score's bias is one load (or one gather) at
// start(head) + the offset key - position, clamped.
#pragma once

#include <optional>
#include <vector>

#include "attn/position_bias.hpp"

namespace attn::core {

// Throws attn::Error naming position_bias when its table, columns or bucket settings are
// not usable with heads_q query heads.
void check_position_bias(const std::optional<PositionBias>& bias, Index heads_q);

// bias_of(bias, head, -o), rounded to float32, per head for the offsets o = key - query position at
// which the bias changes, [first, first + span); every offset beyond them reads the nearest end.
struct BiasByOffset {
  std::vector<float> values;  // [heads_q][span]
  Index first = 0, span = 0;
  // values[start(head) + clamp(o, first, last())] is head's bias at offset o.
  Index start(Index head) const { return head * span - first; }
  Index last() const { return first + span - 1; }
};

BiasByOffset bias_by_offset(const PositionBias& bias, Index heads_q);

// columns[c] += sums[o - first] for each offset o = key - position in [first, first + count),
// c its column: the gradient of one table row from its sums by offset, in offset order.
void add_by_column(const PositionBias& bias, const float* sums, Index first, Index count,
                   double* columns);

}  // namespace attn::core
