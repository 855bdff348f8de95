// Tunables of the fast backward kernel, in one place, with what must hold between them.
#pragma once

#include <algorithm>

#include "attn/tensor.hpp"

namespace attn::cpu {

struct BackwardTraits {
  // A key block is kKeyVectors vectors of keys (keys across lanes); query rows stream past
  // it kQueryTile at a time, kScoreRows rows per score micro-kernel call.
  static constexpr int kKeyVectors = 2;
  static constexpr int kQueryTile = 32;
  // 64: 7-30% slower (the tiles of S, dS, q and dO leave L1). 16: 7-17% slower.
  static constexpr int kScoreRows = 4;
  // Products accumulated into rows of d (O += A^T B: dV, dK, dQ) take kContextRows rows by
  // up to kContextVectors vectors of columns.
  static constexpr int kContextRows = 4;
  static constexpr int kContextVectors = 3;
  // Work items wanted: a (segment, KV head) deals its key blocks to up to kMaxKeyParts
  // items, each summing its own partial dQ (parts x the size of dq, in float32). 4 parts
  // keep one head of L = 32768, d = 64 at 32 MiB of partial dQs (the issue allows 64 MiB
  // of extra memory there) while still feeding 4 threads.
  static constexpr int kItemsWanted = 32;
  static constexpr int kMaxKeyParts = 4;

  // Targets with 32 vector registers (AVX-512) take wider blocks: more accumulators hide
  // the FMA latency, and each broadcast feeds more FMAs.
  static constexpr int kKeyVectorsWide = 4;
  static constexpr int kScoreRowsWide = 4;
  static constexpr int kContextVectorsWide = 4;
  // 6 rows x 4 vectors: 24 FMAs per 4 loads and 6 broadcasts (4 x 4: 0.78-1.04x, 8 x 3:
  // 0.84-1.02x in two noisy interleaved runs on Zen 4).
  static constexpr int kContextRowsWide = 6;

  static_assert(kQueryTile % kScoreRows == 0 && kQueryTile % kScoreRowsWide == 0,
                "a query tile holds whole score blocks");
  // 16 vector registers on AVX2: accumulators plus operands must fit, or the kernels spill.
  static_assert(kScoreRows * kKeyVectors + kKeyVectors + 1 <= 16);
  static_assert(kContextRows * kContextVectors + kContextVectors + 1 <= 16);
  static_assert(kScoreRowsWide * kKeyVectorsWide + kKeyVectorsWide + 1 <= 32);
  static_assert(kContextRowsWide * kContextVectorsWide + kContextVectorsWide + 1 <= 32);
  static_assert(kContextVectors >= 1 && kContextVectorsWide <= 4, "accumulate has 1 to 4");
};

// Parts per (segment, KV head), from the problem's shape alone and never the thread count,
// so that the partial dQs, and so the bits of dq, are the same on any number of threads.
inline Index key_parts(Index segments_heads) {
  const Index pairs = std::max<Index>(segments_heads, 1);
  return std::clamp<Index>((BackwardTraits::kItemsWanted + pairs - 1) / pairs, 1,
                           BackwardTraits::kMaxKeyParts);
}

}  // namespace attn::cpu
