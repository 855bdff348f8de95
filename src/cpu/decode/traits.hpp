// Tunables of the decode kernel, in one place, with what must hold between them.
#pragma once

namespace attn::cpu {

struct DecodeTraits {
  // Keys per split: the unit of parallel work along a sequence. Split points sit at
  // multiples of it (and at the end of a shared prefix), never at thread-count-dependent
  // places, so the merge order, and so the bits, do not depend on the threads.
  static constexpr int kSplitKeys = 512;
  // Most keys per tile (blocks larger than this are cut): scores of a tile are computed,
  // exponentiated and used against V while the tile's pointers and scores stay in L1.
  static constexpr int kKeyTile = 64;
  // Fewest keys per tile: a tile is one block (the KV heads of a block lie one after another,
  // so a tile read head by head streams through memory), unless blocks are smaller than
  // this, when a tile holds enough whole blocks to reach it. 16: at page 16 a tile of
  // four blocks read head by head streamed at 19 GB/s, one block at 29 GB/s (a read-only
  // probe, huge pages, 1 thread).
  static constexpr int kMinTileKeys = 16;
  // Query rows scored and accumulated together (one K/V load feeds this many rows).
  static constexpr int kRowBlock = 4;
  // Key rows (summed over KV heads) per thread below which fewer threads are started: a
  // small step costs less than waking a thread on a busy machine (41 steps of a 3-sequence
  // test took 1 s with 2 threads on the shared 2-core box, 20 ms with 1).
  static constexpr int kMinKeysPerThread = 4096;

  static_assert(2 * kMinTileKeys - 2 <= kKeyTile,
                "whole blocks of fewer than kMinTileKeys keys make a tile of at most "
                "2 kMinTileKeys - 2 keys, which must fit the tile's scratch");
  static_assert(kRowBlock >= 1 && kRowBlock <= 4, "row_block kernels are written for 1 to 4");
};

}  // namespace attn::cpu
