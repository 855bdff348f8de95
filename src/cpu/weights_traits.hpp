// Tunables of the weights pass (src/cpu/weights.cpp), in one place, with what must hold
// between them. Measured with attn_bench (B=1 H=8 L=2048 d=64, fp32, 9 interleaved
// repetitions) on the shared dev machine (AVX3 target), at a quiet moment: forward 96 ms,
// every weight 121 ms (1.25x), top 8 103 ms (1.07x) at 1 thread; 49, 64 (1.32x) and
// 54 ms (1.10x) at 2 threads.
#pragma once

namespace attn::cpu {

struct WeightsTraits {
  // Keys per tile: K^T is packed once per tile and work item. Tiles start at multiples of
  // kKeyTile in every row's key coordinates, so a row's result does not depend on which
  // other rows share its work item (selections give the same bits as the full matrix).
  static constexpr int kKeyTile = 128;
  // Output rows per work item: the packed K^T tile is reused by this many rows.
  static constexpr int kItemRows = 64;
  // Score micro-kernel: kScoreRows query rows broadcast against kScoreVectors vectors of
  // keys, one accumulator per pair (the same FMA chain per score as the forward kernel).
  static constexpr int kScoreRows = 4;
  static constexpr int kScoreVectors = 3;
  // Streaming (non-temporal) stores for a dense output of 64 MiB or more: no gain measured
  // (187 vs 180 ms CPU time for every weight at L=2048, noise about +-5%), so plain stores.

  static_assert(kKeyTile % 16 == 0, "a tile holds whole vectors of up to 16 lanes");
  static_assert(kItemRows % kScoreRows == 0, "items hold whole row blocks");
  // 16 vector registers on AVX2: accumulators, one key vector per column and a broadcast.
  static_assert(kScoreRows * kScoreVectors + kScoreVectors + 1 <= 16);
};

}  // namespace attn::cpu
