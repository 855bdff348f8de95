// Tunables of the fast forward kernel, in one place, with what must hold between them.
// Measured with tests/timing/kernel_timing (1 thread, B=1 H=8 L=2048, d=64 and 128, fp32,
// causal and not) on the AMD Zen 4 dev machine (AVX3 target), medians of 7 runs on a shared
// machine (noise about +-5%); alternatives that lost are noted beside the winner.
#pragma once

#include <algorithm>

#include "attn/tensor.hpp"
#include "core/problem.hpp"

namespace attn::cpu {

// kDim: the head dim fixed at compile time (q, k and v share it), or 0 for "any, read at
// run time". See with_head_dim() in forward.cpp for the dims that get their own copy.
template <int kDim>
struct ForwardTraits {
  // Keys per tile: the unit of tile skipping and of converting f16/bf16 K and V to f32.
  static constexpr int kKeyTile = kDim >= 256 ? 64 : 128;
  // 64 for all dims: 3-5% slower at d=64 and d=128. 256: equal non-causal, 9% slower causal.
  // Query rows per work item in SIMD vectors (rows = query heads sharing a KV head x
  // query positions); Qt and the context accumulators of one item stay in L2.
  static constexpr int kRowVectorsPerItem = 6;
  // 3: 6-8% slower (K/V tiles reused by fewer rows). 12: 7-25% slower (Qt leaves L1).
  // Rows per item, at least, when K or V tiles are widened into scratch (f16 and bf16
  // inputs), so that more rows share each conversion: on Zen 3 (AVX2, where 6 vectors are
  // 48 rows) 96 made bf16 and fp16 forwards 1-18% faster (median 9%); f32 with 96: -4 to +3%.
  static constexpr int kWidenedRowsPerItem = 96;
  // Score micro-kernel (S^T = K Q^T on a tile): kScoreKeys keys broadcast against up to
  // kScoreRowVectors vectors of transposed query rows, one accumulator per pair.
  static constexpr int kScoreKeys = 4;
  static constexpr int kScoreRowVectors = 3;
  // 2 keys x 3: 25-30% slower (6 accumulators do not hide the 4-cycle FMA latency).
  // Context micro-kernel (O += P V): kContextRows rows x up to kContextVectors vectors of
  // the value dim, P broadcast against V rows.
  static constexpr int kContextRows = 4;
  static constexpr int kContextVectors = 3;
  // 4 x 2 vectors: equal within noise at d=128, 12% slower at d=64 causal.

  static_assert(kDim >= 0, "head dim is positive, or 0 for run time");
  static_assert(kKeyTile % kScoreKeys == 0, "a tile holds whole score micro-blocks");
  // 16 vector registers on AVX2: accumulators plus one operand vector per column and one
  // broadcast must fit, or the micro-kernels spill.
  static_assert(kScoreKeys * kScoreRowVectors + kScoreRowVectors + 1 <= 16);
  static_assert(kContextRows * kContextVectors + kContextVectors + 1 <= 16);
  static_assert(kContextVectors >= 1 && kContextVectors <= 3, "context_columns has 1 to 3");
  // A context block never straddles two row vectors: lanes are 4, 8 or 16 (the 1-lane
  // scalar target uses blocks of 1 row).
  static_assert(kContextRows == 4);
  static_assert(kRowVectorsPerItem % kScoreRowVectors == 0, "items hold whole row chunks");
  // 96 rows are whole chunks of 3 vectors of 1, 4, 8 or 16 lanes.
  static_assert(kWidenedRowsPerItem % (kScoreRowVectors * 16) == 0);
};

// Whether K or V come in a dtype the forward kernel widens into f32 scratch tile by tile
// (f16, bf16): the rule that picks kWidenedRowsPerItem.
inline bool forward_widens_tiles(DType k, DType v) {
  return k != DType::f32 || v != DType::f32;
}

// Query positions per work item: kRowVectorsPerItem vectors of rows (kWidenedRowsPerItem
// rows when they are more and the item widens its tiles), each position giving a row per
// query head of the GQA group.
inline Index positions_per_item(Index group, Index lanes, bool widened) {
  using Traits = ForwardTraits<0>;
  const Index rows = Traits::kRowVectorsPerItem * lanes;
  return std::max<Index>(
      1, (widened ? std::max<Index>(rows, Traits::kWidenedRowsPerItem) : rows) / group);
}

// A chunk of `real_rows` query rows (of a vector of `lanes`) is scored by dot products
// when it holds at most half a vector: broadcasting keys against Qt would waste half the
// lanes or more (decoding one token, a GQA group of four on AVX2), where dot products
// read each key once for four rows.
inline bool chunk_scored_by_dot(Index real_rows, Index lanes) {
  return real_rows * 2 <= lanes;
}

// Whether the forward kernel scores the query row of position i (of len_q in its segment)
// and head g of a GQA group of `group` heads by dot products (plan_chunk in forward.cpp
// decides by chunk_scored_by_dot on the row's chunk). The weights pass asks, so that it
// computes every score with the micro-kernel forward used for it (and for the other rows,
// with bf16 q and k on AVX512-BF16, forward's dot products of cpu/bf16_dot.hpp).
inline bool forward_scores_by_dot(Index len_q, Index i, Index g, Index group, Index lanes,
                                  bool widened) {
  const Index positions = positions_per_item(group, lanes, widened);
  const Index first_position = i - i % positions;
  const Index rows = std::min(positions, len_q - first_position) * group;
  const Index chunk_rows = ForwardTraits<0>::kScoreRowVectors * lanes;
  const Index row = (i - first_position) * group + g;
  const Index chunk_first = row - row % chunk_rows;
  return chunk_scored_by_dot(std::min(rows, chunk_first + chunk_rows) - chunk_first, lanes);
}

// Whether forward scores any row of the problem in a wide chunk (not by dot products): only
// then do its wide scores need inputs packed before the items (cpu/amx/key_parts-inl.h). A
// segment's first row lies in its largest chunk, so that chunk decides for the segment.
inline bool forward_has_wide_chunks(const core::Problem& p, Index lanes, bool widened) {
  return std::any_of(p.segments.begin(), p.segments.end(), [&](const core::Segment& segment) {
    return segment.len_q > 0 &&
           !forward_scores_by_dot(segment.len_q, 0, 0, p.group_size(), lanes, widened);
  });
}

}  // namespace attn::cpu
