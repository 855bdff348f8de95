// Tunables of the paged kernel, in one place, with what must hold between them.
#pragma once

namespace attn::cpu {

// Batch invariance: a row's bits must not depend on the thread count, the page size, the
// other sequences of a call or its sequence's other queries. So every cut that changes
// arithmetic sits at a fixed multiple of a key position: parts (merged by the state merge)
// at multiples of kSplitKeys, online-softmax steps at multiples of kSoftmaxKeys. Page size,
// sharing and threads change only which keys are fetched together and who computes.
struct DecodeTraits {
  // Keys per split: the unit of parallel work along a sequence. Split points sit at
  // multiples of it, never at thread-count-dependent places, so the merge order, and so the
  // bits, do not depend on the threads; a shared prefix is shared in whole splits.
  static constexpr int kSplitKeys = 512;
  // Queries per task: a long query run (a prefill chunk) is cut into runs this long, so it
  // spreads over the threads beside the one-token steps of a mixed batch.
  static constexpr int kSplitQueries = 32;
  // Queries from which a query run's parts make one task that merges each part's states as
  // it goes (DecodeParts' merged tasks), and how many such runs per thread a call needs for
  // it: fewer, and the runs' parts stay tasks of their own, spread over the threads.
  static constexpr int kMergedRunQueries = 16;
  static constexpr int kMergedRunsPerThread = 2;
  // Most keys per tile (blocks larger than this are cut): scores of a tile are computed,
  // exponentiated and used against V while the tile's pointers and scores stay in L1.
  static constexpr int kKeyTile = 64;
  // Fewest keys per tile: a tile is one block (the KV heads of a block lie one after another,
  // so a tile read head by head streams through memory), unless blocks are smaller than
  // this, when a tile holds enough whole blocks to reach it. 16: at page 16 a tile of
  // four blocks read head by head streamed at 19 GB/s, one block at 29 GB/s (a read-only
  // probe, huge pages, 1 thread).
  static constexpr int kMinTileKeys = 16;
  // Keys per online-softmax step: a tile's scores are folded into each row's state this many
  // keys at a time, from a multiple of it, whatever the tile (and so the page size).
  static constexpr int kSoftmaxKeys = 16;
  // How far ahead of the tile being computed lies the tile whose rows are asked to L2: in
  // head-major pages, and in token-major ones, where one KV head's rows of a page lie apart
  // and a further tile kept steps from memory near head-major's (bench/README.md).
  static constexpr int kTilesAheadHeadMajor = 2, kTilesAheadTokenMajor = 3;
  // Query rows scored and accumulated together (one K/V load feeds this many rows).
  static constexpr int kRowBlock = 4;
  // Rows of a KV head above which a tile's 16-bit and int8 keys and values are widened to
  // float32 once (a prefill run), not once per block of kRowBlock rows, and bf16 keys for
  // vdpbf16ps are laid in pairs once (tile::pack_key_pairs).
  static constexpr int kWidenRows = 16;
  // Key rows (summed over KV heads, and per kRowsPerWork rows of a KV head) per thread below
  // which fewer threads are started: a small step costs less than waking a thread on a busy
  // machine (41 steps of a 3-sequence test took 1 s with 2 threads on the shared 2-core box,
  // 20 ms with 1).
  static constexpr int kMinKeysPerThread = 4096;
  static constexpr int kRowsPerWork = 16;

  static_assert(kMinTileKeys % kSoftmaxKeys == 0 && kKeyTile % kSoftmaxKeys == 0,
                "tiles hold whole softmax steps");
  static_assert(kSplitKeys % kKeyTile == 0, "parts hold whole tiles");
  static_assert(2 * kMinTileKeys <= kKeyTile,
                "whole blocks of fewer than kMinTileKeys keys, rounded up to a power of two, "
                "make a tile of at most 2 kMinTileKeys keys, which must fit the tile's scratch");
  static_assert(kRowBlock >= 1 && kRowBlock <= 4, "row_block kernels are written for 1 to 4");
};

}  // namespace attn::cpu
