// O^T += V^T P^T on AMX tiles (TDPBF16PS), for forward's context where the CPU has AMX and V
// is bf16: tile A is V^T (16 value dims x 32 keys, packed once per KV head by PackedValues,
// cpu/amx/packed_values-inl.h), tile B the weights' pairs of keys [key / 2][rows][2] (the
// layout of the query pairs, cpu/bf16_dot.hpp), tile C 16 value dims x 16 rows of the
// transposed context. With one part (Options::pv_precision bf16, the default, for bf16 V)
// each weight is rounded to bf16 once; with pv_precision exact put_weight_parts cuts each
// weight into three bf16 parts whose sum is the weight exactly, and each part is multiplied
// in turn, so the context is float32 sums of exact products, as on the float path: three
// products where rounded takes one. fp16 V goes in as its two exact bf16 parts
// (cpu/amx/fp16_parts.hpp), each a V^T of its own, so six products per tile of work; with
// pv_precision bf16 the weights then go in as their first two parts (kFp16VWeightParts), four.
// A template over the tile instructions (cpu/amx/tiles.hpp), so that the tests run it on a
// model of them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "attn/tensor.hpp"
#include "cpu/amx/tiles.hpp"

namespace attn::cpu {

constexpr int kWeightParts = 3;  // bf16 parts of a float32 weight: 3 x 8 bits of significand
// Parts of a weight against fp16 V with pv_precision bf16: within 2^-15 of it, finer than an
// fp16 output, where one rounded part left fp16 outputs 17-27x PyTorch's NMSE on Emerald Rapids.
constexpr int kFp16VWeightParts = 2;
constexpr Index kAmxKeyBlock = 32;     // keys per tile row of A: the K of one TDPBF16PS
constexpr Index kAmxRows = kTileRows;  // rows (or value dims) per tile

// Elements between the rows of a packed V^T (PackedValues, cpu/amx/packed_values-inl.h) of
// `keys` keys: the keys in whole key blocks, one block more where that would be an even
// number of blocks (rows an even number of 64-byte lines apart crowd into fewer L1 sets, and
// the contexts read 8 to 32 rows at once).
constexpr Index packed_values_stride(Index keys) {
  const Index blocks = (keys + kAmxKeyBlock - 1) / kAmxKeyBlock;
  return (blocks % 2 == 0 ? blocks + 1 : blocks) * kAmxKeyBlock;
}

// The top 16 bits of a float's pattern: a bf16 by truncation. x minus it is exact in float.
inline std::uint32_t high_half(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return bits & 0xFFFF0000u;
}
// x rounded to bf16, to nearest with ties to even, as a float pattern with a zero low half
// (x finite: weights are in [0, 1]).
inline std::uint32_t rounded_half(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
}
inline float float_of(std::uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

// The bf16 parts of w, high to low, as float patterns with a zero low half. Three (the
// default): each truncates what the ones before left, so w = hi + mid + lo exactly (8 bits
// of w's 24 each); AMX reads a part below float's normal range (2^-126) as 0: a change
// below 2^-126 in a weight, against its row's largest weight of 1. Two: hi and mid, w less
// lo. One: w rounded (rounded_half), for Options::pv_precision bf16.
struct WeightParts {
  std::uint32_t part[kWeightParts];
};
inline WeightParts weight_parts(float w, int parts = kWeightParts) {
  WeightParts out{};
  if (parts == 1) {
    out.part[0] = rounded_half(w);
    return out;
  }
  float left = w;
  for (int q = 0; q < kWeightParts; ++q) {
    out.part[q] = high_half(left);
    left -= float_of(out.part[q]);
  }
  return out;
}

// One pair of keys of put_weight_parts, each key's weights or (not seen) zeros; the
// loop over rows is straight-line, for the compiler to vectorise.
template <bool kEvenSeen, bool kOddSeen>
void put_pair_parts(const float* even, const float* odd, Index rows, Index plane, int parts,
                    std::uint32_t* pair) {
  for (Index r = 0; r < rows; ++r) {
    const WeightParts a = weight_parts(kEvenSeen ? even[r] : 0.0f, parts);
    const WeightParts b = weight_parts(kOddSeen ? odd[r] : 0.0f, parts);
    for (int q = 0; q < parts; ++q) pair[q * plane + r] = (a.part[q] >> 16) | b.part[q];
  }
}

// parts[q][k / 2][r] (uint32 pairs: key k in the low half, k + 1 in the high) = part q of
// the weight of key k and row r, for keys [0, span) and `rows` rows, where the weights of
// keys [first, end) are weights_t ([key][weights_stride] floats at key `first` and the first
// row) and the others 0. span is even; parts: [weight_parts][span / 2][rows_stride], the
// weights in their first weight_parts parts (weight_parts 1: rounded to bf16).
inline void put_weight_parts(const float* weights_t, Index weights_stride, Index first, Index end,
                             Index span, Index rows, Index rows_stride, int weight_parts,
                             std::uint32_t* parts) {
  const Index plane = span / 2 * rows_stride;
  for (Index k = 0; k < span; k += 2) {
    const bool even_seen = k >= first && k < end, odd_seen = k + 1 >= first && k + 1 < end;
    const float* even = weights_t + (even_seen ? k - first : 0) * weights_stride;
    const float* odd = weights_t + (odd_seen ? k + 1 - first : 0) * weights_stride;
    std::uint32_t* pair = parts + k / 2 * rows_stride;
    if (even_seen && odd_seen) {
      put_pair_parts<true, true>(even, odd, rows, plane, weight_parts, pair);
    } else if (even_seen) {
      put_pair_parts<true, false>(even, odd, rows, plane, weight_parts, pair);
    } else if (odd_seen) {
      put_pair_parts<false, true>(even, odd, rows, plane, weight_parts, pair);
    } else {
      put_pair_parts<false, false>(even, odd, rows, plane, weight_parts, pair);
    }
  }
}

// The words of put_weight_parts' layout (rows_stride == rows) for the pairs of keys [0, span)
// outside [first, end), first even, zeroed: what is left to lay when the pairs of
// [first, end) come from elsewhere (forward's softmax, tile::WeightPairSink).
inline void zero_pairs_outside(Index first, Index end, Index span, Index rows, int weight_parts,
                               std::uint32_t* parts) {
  const Index plane = span / 2 * rows, first_pair = first / 2, end_pair = (end + 1) / 2;
  for (int q = 0; q < weight_parts; ++q) {
    std::uint32_t* part = parts + q * plane;
    std::fill(part, part + first_pair * rows, 0u);
    std::fill(part + end_pair * rows, part + plane, 0u);
  }
}

namespace amx {

// Value dims of kValueBlocks blocks of 16 (A: a part of V^T, loaded once per key block for
// the weight parts) against every row vector (B: a part's weight pairs), two at a time.
template <class Tiles, int kValueBlocks>
void context_rows(const std::uint16_t* values_t, long values_bytes, int value_parts,
                  Index value_plane, const std::uint32_t* parts, int weight_parts, Index part_plane,
                  Index rows_stride, Index span, int vectors, float* out, long out_bytes) {
  const long pair_bytes = static_cast<long>(rows_stride) * 4;
  const Index value_block = kAmxRows * values_bytes / 2;  // 16 value dims on, in elements
  in_twos(vectors, [&](auto row_vectors, Index v) {
    using Block = TileBlock<Tiles, kValueBlocks, decltype(row_vectors)::value>;
    Block::load(out + v * kAmxRows, out_bytes);
    for (Index k = 0; k < span; k += kAmxKeyBlock) {
      for (int part = 0; part < value_parts; ++part) {
        Block::load_a(values_t + part * value_plane + k, value_block, values_bytes);
        for (int q = 0; q < weight_parts; ++q) {
          Block::load_b(parts + q * part_plane + k / 2 * rows_stride + v * kAmxRows, kAmxRows,
                        pair_bytes);
          Block::multiply();
        }
      }
    }
    Block::store(out + v * kAmxRows, out_bytes);
  });
}

}  // namespace amx

// out_t[d][r] += sum over keys k < span of P[k][r] V[k][d], for value dims d < value_blocks
// x 16 and `vectors` (1 to 3) vectors of 16 rows: values_t is V^T ([d][values_stride] bf16 at
// the span's first key), parts the weights as put_weight_parts lays them (rows_stride rows),
// out_t [d][out_stride] floats at the first row. span is a whole number of key blocks (32).
// With value_parts 2, V is the sum of two such V^T, the second value_plane elements on.
template <class Tiles>
void context_by_amx(const std::uint16_t* values_t, Index values_stride, Index value_blocks,
                    const std::uint32_t* parts, int weight_parts, Index rows_stride, Index span,
                    int vectors, float* out_t, Index out_stride, int value_parts = 1,
                    Index value_plane = 0) {
  static constexpr TileConfig kConfig = full_tiles();
  Tiles::configure(kConfig);
  const long values_bytes = static_cast<long>(values_stride) * 2;
  const long out_bytes = static_cast<long>(out_stride) * 4;
  const Index part_plane = span / 2 * rows_stride;
  in_twos(value_blocks, [&](auto blocks, Index d) {
    amx::context_rows<Tiles, decltype(blocks)::value>(
        values_t + d * kAmxRows * values_stride, values_bytes, value_parts, value_plane, parts,
        weight_parts, part_plane, rows_stride, span, vectors, out_t + d * kAmxRows * out_stride,
        out_bytes);
  });
  Tiles::release();
}

}  // namespace attn::cpu
