// Tunables of the fast forward kernel, in one place, with what must hold between them.
// Measured with scripts/bench-kernel (1 thread, B=1 H=8 L=2048, fp32) on the AMD Zen 4 dev
// machine (AVX3 target); alternatives that lost are noted beside the winner.
#pragma once

namespace attn::cpu {

// kDim: the head dim fixed at compile time (q, k and v share it), or 0 for "any, read at
// run time". See with_head_dim() in forward.cpp for the dims that get their own copy.
template <int kDim>
struct ForwardTraits {
  // Keys per tile: the unit of tile skipping and of converting f16/bf16 K and V to f32.
  static constexpr int kKeyTile = kDim >= 256 ? 64 : 128;
  // Query rows per work item in SIMD vectors (rows = query heads sharing a KV head x
  // query positions); Qt and the context accumulators of one item stay in L2.
  static constexpr int kRowVectorsPerItem = 6;
  // Score micro-kernel (S^T = K Q^T on a tile): kScoreKeys keys broadcast against up to
  // kScoreRowVectors vectors of transposed query rows, one accumulator per pair.
  static constexpr int kScoreKeys = 4;
  static constexpr int kScoreRowVectors = 3;
  // Context micro-kernel (O += P V): kContextRows rows x up to kContextVectors vectors of
  // the value dim, P broadcast against V rows.
  static constexpr int kContextRows = 4;
  static constexpr int kContextVectors = 3;

  static_assert(kDim >= 0, "head dim is positive, or 0 for run time");
  static_assert(kKeyTile % kScoreKeys == 0, "a tile holds whole score micro-blocks");
  // 16 vector registers on AVX2: accumulators plus one operand vector per column and one
  // broadcast must fit, or the micro-kernels spill.
  static_assert(kScoreKeys * kScoreRowVectors + kScoreRowVectors + 1 <= 16);
  static_assert(kContextRows * kContextVectors + kContextVectors + 1 <= 16);
  // A context block never straddles two row vectors: lanes are 4, 8 or 16 (the 1-lane
  // scalar target uses blocks of 1 row).
  static_assert(kContextRows == 4);
  static_assert(kRowVectorsPerItem % kScoreRowVectors == 0, "items hold whole row chunks");
};

}  // namespace attn::cpu
