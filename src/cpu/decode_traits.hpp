// Tunables of the decode kernel, in one place, with what must hold between them.
#pragma once

namespace attn::cpu {

struct DecodeTraits {
  // Keys per split: the unit of parallel work along a sequence. Split points sit at
  // multiples of it (and at the end of a shared prefix), never at thread-count-dependent
  // places, so the merge order, and so the bits, do not depend on the threads.
  static constexpr int kSplitKeys = 512;
  // Keys per tile: scores of a tile are computed, exponentiated and used against V while
  // the tile's pointers and scores stay in L1.
  static constexpr int kKeyTile = 64;
  // 32: 5% slower with K/V in L2 (Lk = 512), equal from memory (Lk = 32768). Software
  // prefetch of the next tiles (64 or 256 keys ahead) measured within noise of none at
  // Lk = 32768 and was dropped.
  // Query rows scored and accumulated together (one K/V load feeds this many rows).
  static constexpr int kRowBlock = 4;
  // Key rows (summed over KV heads) per thread below which fewer threads are started: a
  // small step costs less than waking a thread on a busy machine (41 steps of a 3-sequence
  // test took 1 s with 2 threads on the shared 2-core box, 20 ms with 1).
  static constexpr int kMinKeysPerThread = 4096;

  static_assert(kSplitKeys % kKeyTile == 0, "a split holds whole tiles");
  static_assert(kRowBlock >= 1 && kRowBlock <= 4, "row_block kernels are written for 1 to 4");
};

}  // namespace attn::cpu
