#include "core/position_bias.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/argument_checks.hpp"

namespace attn {
namespace {

// T5's bucket of a distance r >= 0 among n buckets: r itself below n / 2, then
// log-spaced up to max_distance, in float32 as T5's reference code computes it.
Index t5_bucket(Index r, Index n, Index max_distance) {
  const Index exact = n / 2;
  if (r < exact) return r;
  const float log_ratio = std::log(static_cast<float>(r) / static_cast<float>(exact));
  const auto log_span =
      static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(exact)));
  const float large = log_ratio / log_span * static_cast<float>(n - exact);
  return std::min(exact + static_cast<Index>(large), n - 1);
}

}  // namespace

Index bias_column(const PositionBias& bias, Index distance) {
  switch (bias.buckets) {
    case BiasBuckets::clipped:
      return std::clamp<Index>(distance + bias.offset, 0, bias.columns - 1);
    case BiasBuckets::t5: {
      // T5's relative position is key - query = -distance; keys after the query take the
      // upper half.
      const Index half = bias.columns / 2;
      return (distance < 0 ? half : 0) + t5_bucket(std::abs(distance), half, bias.max_distance);
    }
    case BiasBuckets::t5_causal:
      return t5_bucket(std::max<Index>(distance, 0), bias.columns, bias.max_distance);
  }
  return 0;
}

double bias_of(const PositionBias& bias, Index head, Index distance) {
  const bool shared = static_cast<Index>(bias.table.size()) == bias.columns;
  return bias.table[static_cast<std::size_t>((shared ? 0 : head) * bias.columns +
                                             bias_column(bias, distance))];
}

namespace core {

void check_position_bias(const std::optional<PositionBias>& bias, Index heads_q) {
  if (!bias) return;
  constexpr Index kLimit = Index{1} << 30;
  const Index least = bias->buckets == BiasBuckets::t5          ? 4
                      : bias->buckets == BiasBuckets::t5_causal ? 2
                                                                : 1;
  if (bias->columns < least || bias->columns >= kLimit) {
    fail("position_bias.columns",
         "a count in [" + std::to_string(least) + ", 2^30) for these buckets",
         std::to_string(bias->columns));
  }
  const auto size = static_cast<Index>(bias->table.size());
  if (size != bias->columns && size != heads_q * bias->columns) {
    fail("position_bias.table",
         std::to_string(bias->columns) + " values (one row for every head) or " +
             std::to_string(heads_q * bias->columns) + " (" + std::to_string(heads_q) +
             " heads x " + std::to_string(bias->columns) + " columns)",
         std::to_string(size) + " values");
  }
  for (Index i = 0; i < size; ++i) {
    if (!std::isfinite(bias->table[static_cast<std::size_t>(i)])) {
      fail("position_bias.table", "finite values",
           std::to_string(bias->table[static_cast<std::size_t>(i)]) + " at head " +
               std::to_string(i / bias->columns) + ", column " + std::to_string(i % bias->columns));
    }
  }
  if (bias->buckets == BiasBuckets::clipped) {
    if (bias->offset <= -kLimit || bias->offset >= kLimit) {
      fail("position_bias.offset", "a magnitude below 2^30", std::to_string(bias->offset));
    }
    return;
  }
  // The log-spaced buckets start at the exact ones' end and need room to grow.
  const Index exact = (bias->buckets == BiasBuckets::t5 ? bias->columns / 2 : bias->columns) / 2;
  if (bias->max_distance <= exact || bias->max_distance >= kLimit) {
    fail("position_bias.max_distance",
         "a distance in (" + std::to_string(exact) +
             ", 2^30): beyond the exact buckets, which end at " + std::to_string(exact),
         std::to_string(bias->max_distance));
  }
}

BiasByOffset bias_by_offset(const PositionBias& bias, Index heads_q) {
  // The distances d = -o outside [low, high] read the same column as low or high.
  Index low = -bias.max_distance, high = bias.max_distance;
  if (bias.buckets == BiasBuckets::clipped) {
    low = -bias.offset;
    high = bias.columns - 1 - bias.offset;
  } else if (bias.buckets == BiasBuckets::t5_causal) {
    low = 0;
  }
  BiasByOffset out;
  out.first = -high;
  out.span = high - low + 1;
  out.values.resize(static_cast<std::size_t>(heads_q * out.span));
  for (Index h = 0; h < heads_q; ++h) {
    for (Index o = 0; o < out.span; ++o) {
      out.values[static_cast<std::size_t>(h * out.span + o)] =
          static_cast<float>(bias_of(bias, h, -(out.first + o)));
    }
  }
  return out;
}

void add_by_column(const PositionBias& bias, const float* sums, Index first, Index count,
                   double* columns) {
  for (Index o = 0; o < count; ++o) columns[bias_column(bias, -(first + o))] += sums[o];
}

}  // namespace core
}  // namespace attn
