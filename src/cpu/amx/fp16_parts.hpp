// fp16 on AMX's bf16 tiles, exactly. An fp16 value has 11 significant bits: it
// is the sum of two bf16, its float32's high half (8 bits) and the remainder (at most 3 bits,
// never below 2^-24 in magnitude, so never a bf16 denormal that TDPBF16PS would flush). A key's
// row holds the pairs (high, low) along d; a query row goes in twice, as pairs (high, high)
// and then (low, low), so that scores_by_amx's two passes sum k_d q_high_d, then k_d q_low_d:
// four exact products per d, added in float32 as the float path adds its one. fp16 V goes into
// V^T as its two parts (PackedValues, cpu/amx/packed_values-inl.h). The parts serve on
// CPUs with AMX-FP16 too: its TDPFP16PS reads fp16 denormals as zero, so it would drop
// products that the float path keeps.
//
// A part of an infinity or NaN would be inf * 0 = NaN against a zero part of the other side,
// where the float path gets an infinity, so such a value goes whole into its high part, and
// fp16_scores_by_amx scores its key or row again from the parts' sums, the float path's way.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "attn/tensor.hpp"
#include "cpu/amx/scores.hpp"

namespace attn::cpu {

struct Fp16Parts {
  std::uint16_t high = 0, low = 0;
  bool finite = true;
};

inline float bf16_bits_value(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// The parts of an fp16 value given as float32 (widened exactly), in masks rather than
// branches, so that the loops below vectorise.
inline Fp16Parts fp16_parts(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t special =
      0u - static_cast<std::uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
  // A NaN whose payload lies in the low half would truncate to an infinity.
  const std::uint32_t payload = 0u - static_cast<std::uint32_t>((bits & 0x007FFFFFu) != 0u);
  const float low = value - std::bit_cast<float>(bits & 0xFFFF0000u);
  return {static_cast<std::uint16_t>((bits >> 16) | (special & payload & 0x7FC0u)),
          static_cast<std::uint16_t>((std::bit_cast<std::uint32_t>(low) >> 16) & ~special),
          special == 0};
}

// The parts of n fp16 values given as float32: high[i kStep] and low[i kStep]. Returns
// whether every value is finite.
template <int kStep>
bool put_parts(const float* x, Index n, std::uint16_t* high, std::uint16_t* low) {
  unsigned not_finite = 0;
  for (Index i = 0; i < n; ++i) {
    const Fp16Parts parts = fp16_parts(x[i]);
    high[i * kStep] = parts.high;
    low[i * kStep] = parts.low;
    not_finite |= static_cast<unsigned>(!parts.finite);
  }
  return not_finite == 0;
}

// A key row (fp16 values as float32) as tile A takes it: pairs[2 d] = high, pairs[2 d + 1] =
// low (2 dim elements). Returns whether every value is finite.
inline bool put_key_parts(const float* k, Index dim, std::uint16_t* pairs) {
  return put_parts<2>(k, dim, pairs, pairs + 1);
}

// Query row `row` (fp16 values as float32) into [2][dim][rows_stride][2]: block 0 the pairs
// (high, high), block 1 (low, low), against the keys' (high, low). Returns whether every value
// is finite.
inline bool put_query_parts(const float* q, Index dim, Index row, Index rows_stride,
                            std::uint16_t* pairs) {
  bool finite = true;
  for (Index d = 0; d < dim; ++d) {
    const Fp16Parts parts = fp16_parts(q[d]);
    std::uint16_t* high = pairs + (d * rows_stride + row) * 2;
    std::uint16_t* low = high + dim * rows_stride * 2;
    high[0] = high[1] = parts.high;
    low[0] = low[1] = parts.low;
    finite &= parts.finite;
  }
  return finite;
}

// The float path's score of a key or row holding an infinity or NaN: +-inf or NaN, from the
// values the parts sum to (no finite product overflows float32).
inline float score_from_parts(const std::uint16_t* key_pairs, const std::uint16_t* q_pairs,
                              Index rows_stride, Index dim, float scale) {
  float sum = 0.0f;
  for (Index d = 0; d < dim; ++d) {
    const float k = bf16_bits_value(key_pairs[2 * d]) + bf16_bits_value(key_pairs[2 * d + 1]);
    const std::uint16_t* high = q_pairs + d * rows_stride * 2;
    const float q = bf16_bits_value(high[0]) + bf16_bits_value(high[dim * rows_stride * 2]);
    sum = std::fma(k, q, sum);
  }
  return sum * scale;
}

// out[k][row] = scale * k . q for key_count keys (key_parts: [key_count][2 dim], put_key_parts)
// and `vectors` (1 to 3) vectors of 16 rows of q_parts (put_query_parts' layout, at the first
// row); keys_finite and rows_finite (per key, per row from the first) say what those returned.
// Needs amx_scores_fit(2 * dim).
template <class Tiles>
void fp16_scores_by_amx(const std::uint16_t* q_parts, const std::uint8_t* rows_finite,
                        Index rows_stride, const std::uint16_t* key_parts,
                        const std::uint8_t* keys_finite, Index key_count, Index dim, float scale,
                        int vectors, float* out) {
  scores_by_amx<Tiles>(q_parts, rows_stride, key_parts, 2 * dim, key_count, 2 * dim, scale, vectors,
                       out, 2);
  const Index columns = vectors * kTileColumns;
  const auto rescore = [&](Index j, Index c) {
    out[j * rows_stride + c] =
        score_from_parts(key_parts + j * 2 * dim, q_parts + c * 2, rows_stride, dim, scale);
  };
  for (Index j = 0; j < key_count; ++j) {
    if (keys_finite[j]) continue;
    for (Index c = 0; c < columns; ++c) rescore(j, c);
  }
  for (Index c = 0; c < columns; ++c) {
    if (rows_finite[c]) continue;
    for (Index j = 0; j < key_count; ++j) rescore(j, c);
  }
}

}  // namespace attn::cpu
