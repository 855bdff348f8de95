// attn::PositionBias: a learned additive score bias by relative position, one table row per
// head (T5's bucketed table, or a table over clipped distances as in Shaw et al. and
// FlexAttention's `score + bias[h, q_idx - kv_idx]`). The kernels add it to each score
// inside the tile walk, never as an Lq x Lk array, and attn::backward returns its gradient.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

// How the distance d = query position - key position (positions as causal and ALiBi place
// them: Options::causal_align and position_offset) picks a column of the table.
enum class BiasBuckets : std::uint8_t {
  // column clamp(d + offset, 0, columns - 1): every distance its own column, the far ones
  // sharing the edge columns.
  clipped,
  // T5's bidirectional buckets (the encoder's): half the columns for keys at or before the
  // query, half for keys after it; in each half, distances below a quarter of the columns
  // have a column each, longer ones log-spaced columns up to max_distance, and the rest
  // share the last.
  t5,
  // T5's one-directional buckets (the decoder's): keys after the query share column 0;
  // distances below half the columns have a column each, then log-spaced up to
  // max_distance.
  t5_causal,
};

struct PositionBias {
  // [heads][columns], row-major: heads is Hq, or 1 for one row shared by every head. float64,
  // as the reference computes (and gradient checks perturb it); the fast kernels read it
  // rounded to float32.
  std::vector<double> table;
  Index columns = 0;
  BiasBuckets buckets = BiasBuckets::clipped;
  Index offset = 0;          // clipped: the column of distance 0
  Index max_distance = 128;  // t5, t5_causal: the distance from which all share the last
};

// The column of `bias`'s table that distance d (query position - key position) reads. The
// log-spaced buckets are computed in float32 as T5's reference code computes them, so the
// same table gives the same scores as transformers' T5.
Index bias_column(const PositionBias& bias, Index distance);

// The bias that head `head` adds at distance d: its table row's bias_column(bias, d).
double bias_of(const PositionBias& bias, Index head, Index distance);

}  // namespace attn
