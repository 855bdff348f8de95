// Tunables of the walk that forward and the weights pass share (cpu/walk/scorer-inl.h), in
// one place, with what must hold between them. Measured with tests/timing/kernel_timing
// (1 thread, B=1 H=8 L=2048, d=64 and 128, fp32, causal and not) on the AMD Zen 4 dev
// machine (AVX3 target), medians of 7 runs on a shared machine (noise about +-5%);
// alternatives that lost are noted beside the winner.
#pragma once

#include "attn/tensor.hpp"

namespace attn::cpu {

struct WalkTraits {
  // Keys per tile: the unit of tile skipping and of converting f16/bf16 K and V to f32;
  // kWideKeyTile where the head dim is at least kWideDim; kAmxKeyTile where AMX tiles score
  // bf16 heads of kAmxWideDim up to kWideDim. kMostTileKeys bounds them all.
  static constexpr int kKeyTile = 128;
  static constexpr int kWideKeyTile = 64;
  static constexpr Index kWideDim = 256;
  // 64 for all dims: 3-5% slower at d=64 and d=128. 256: equal non-causal, 9% slower causal.
  static constexpr int kAmxKeyTile = 256;
  static constexpr Index kAmxWideDim = 128;
  // Emerald Rapids, bf16, 1 thread: 256 keys 3-8% faster at d=128 (fewer rescales of O^T
  // and tile loads of it per key), 5-10% slower at d=64; 192 between (bench/README.md).
  static constexpr int kMostTileKeys = 256;
  // Query rows per work item in SIMD vectors (rows = query heads sharing a KV head x
  // query positions); Qt and the context accumulators of one item stay in L2.
  static constexpr int kRowVectorsPerItem = 6;
  // 3: 6-8% slower (K/V tiles reused by fewer rows). 12: 7-25% slower (Qt leaves L1).
  // Rows per item, at least, when K tiles are widened into scratch (f16 and bf16 K), so that
  // more rows share each conversion: on Zen 3 (AVX2, where 6 vectors are 48 rows) 96 made
  // bf16 and fp16 forwards 1-18% faster (median 9%); f32 with 96: -4 to +3%.
  static constexpr int kWidenedRowsPerItem = 96;
  // Score micro-kernel (S^T = K Q^T on a tile): kScoreKeys keys broadcast against up to
  // kScoreRowVectors vectors of transposed query rows, one accumulator per pair.
  static constexpr int kScoreKeys = 4;
  static constexpr int kScoreRowVectors = 3;
  // 2 keys x 3: 25-30% slower (6 accumulators do not hide the 4-cycle FMA latency).
  // Arm (32 registers) keeps 4 x 3, by the instructions of one forward under qemu
  // (bench/README.md): 8 x 3 executes 4.0% more on NEON and 1.9% fewer on SVE_256; 4 x 6,
  // 1.4% and 5.7% fewer, too little to make the plan's chunk height a per-target trait
  // before a clock on Arm says it pays.

  static_assert(kKeyTile % kScoreKeys == 0 && kWideKeyTile % kScoreKeys == 0 &&
                    kAmxKeyTile % kScoreKeys == 0,
                "a tile holds whole score micro-blocks");
  static_assert(kAmxKeyTile % 32 == 0, "an AMX tile holds whole key blocks (cpu/amx/context.hpp)");
  static_assert(kWideKeyTile <= kMostTileKeys && kKeyTile <= kMostTileKeys &&
                    kAmxKeyTile <= kMostTileKeys,
                "kMostTileKeys bounds every tile's scratch");
  // 16 vector registers on AVX2: accumulators plus one operand vector per column and one
  // broadcast must fit, or the micro-kernel spills.
  static_assert(kScoreKeys * kScoreRowVectors + kScoreRowVectors + 1 <= 16);
  static_assert(kRowVectorsPerItem % kScoreRowVectors == 0, "items hold whole row chunks");
  // 96 rows are whole chunks of 3 vectors of 1, 4, 8 or 16 lanes.
  static_assert(kWidenedRowsPerItem % (kScoreRowVectors * 16) == 0);
};

}  // namespace attn::cpu
