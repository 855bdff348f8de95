// S^T = scale K Q^T on bf16 q and k by AMX tiles (TDPBF16PS): the AMX twin of the AVX512-BF16
// kernel of cpu/bf16_dot.hpp, with its arguments and layouts, which it serves where the CPU
// has AMX (scores_rows_bf16 chooses). K's rows are tile A, read in place; the query pairs
// [d / 2][rows][2] are tile B as they lie; each tile C is 16 keys x 16 rows of S^T.
// A template over the tile instructions (cpu/amx/tiles.hpp), so that the tests run it on a
// model of them where the CPU has no AMX.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "attn/tensor.hpp"
#include "cpu/amx/tiles.hpp"

namespace attn::cpu {

// Head dims the AMX kernel takes: whole tile rows of 32 bf16, and a partial key block
// fitting its scratch. Others stay on the AVX512-BF16 kernel.
constexpr Index kAmxMaxDim = 256;
constexpr bool amx_scores_fit(Index dim) {
  return dim % 32 == 0 && dim <= kAmxMaxDim;
}

namespace amx {

constexpr Index kPairsPerTile = kTileBytesPerRow / 4;  // 16 pairs: 32 of d

// Keys of kKeyBlocks blocks of 16 (A) against every row vector (B), two at a time; A's rows
// are read once per pass, each pass against the next dim / 2 pairs of B.
template <class Tiles, int kKeyBlocks>
void score_keys(const std::uint16_t* keys, long key_bytes, const std::uint16_t* q_pairs,
                Index rows_stride, Index dim, int passes, int vectors, float* out, long out_bytes) {
  const long pair_bytes = static_cast<long>(rows_stride) * 4;
  const Index key_block = kTileRows * key_bytes / 2;  // 16 keys on, in bf16 elements
  in_twos(vectors, [&](auto row_vectors, Index v) {
    using Block = TileBlock<Tiles, kKeyBlocks, decltype(row_vectors)::value>;
    const std::uint16_t* q = q_pairs + v * kTileColumns * 2;
    Block::zero();
    for (Index pass = 0; pass < passes; ++pass) {
      for (Index d = 0; d < dim; d += 2 * kPairsPerTile) {
        Block::load_a(keys + d, key_block, key_bytes);
        Block::load_b(q + ((pass * dim + d) / 2) * rows_stride * 2, kTileColumns * 2, pair_bytes);
        Block::multiply();
      }
    }
    Block::store(out + v * kTileColumns, out_bytes);
  });
}

}  // namespace amx

// out[k][row] = scale * sum_d keys[k][d] q[row][d] for key_count keys, bf16 rows of dim
// (amx_scores_fit) at key_stride elements apart, and `vectors` (1 to 3) vectors of 16 rows of
// q_pairs ([dim / 2][rows_stride][2], at the first row); out: [key_count][rows_stride] at the
// first row. The last key_count % 16 keys go through zero-padded scratch. With passes > 1,
// q_pairs holds that many such blocks one after the other, and each key row is multiplied
// by all of them into one sum (cpu/amx/fp16_parts.hpp's four products). With scaled false,
// out is left unscaled, for a caller that multiplies each score by scale as it reads it (the
// forward's online softmax, Scorer::score in cpu/walk/scorer-inl.h): a pass fewer over out.
template <class Tiles>
void scores_by_amx(const std::uint16_t* q_pairs, Index rows_stride, const std::uint16_t* keys,
                   Index key_stride, Index key_count, Index dim, float scale, int vectors,
                   float* out, int passes = 1, bool scaled = true) {
  static constexpr TileConfig kConfig = full_tiles();
  Tiles::configure(kConfig);
  const long key_bytes = static_cast<long>(key_stride) * 2;
  const long out_bytes = static_cast<long>(rows_stride) * 4;
  in_twos(key_count / kTileRows, [&](auto blocks, Index block) {
    const Index k = block * kTileRows;
    amx::score_keys<Tiles, decltype(blocks)::value>(keys + k * key_stride, key_bytes, q_pairs,
                                                    rows_stride, dim, passes, vectors,
                                                    out + k * rows_stride, out_bytes);
  });
  if (const Index k = key_count / kTileRows * kTileRows; k < key_count) {
    constexpr Index kScratchColumns = 3 * kTileColumns;
    alignas(64) std::uint16_t tail_keys[kTileRows * kAmxMaxDim];
    alignas(64) float tail_out[kTileRows * kScratchColumns];
    std::fill_n(tail_keys, kTileRows * dim, std::uint16_t{0});
    for (Index j = k; j < key_count; ++j) {
      std::memcpy(tail_keys + (j - k) * dim, keys + j * key_stride, dim * sizeof(std::uint16_t));
    }
    amx::score_keys<Tiles, 1>(tail_keys, static_cast<long>(dim) * 2, q_pairs, rows_stride, dim,
                              passes, vectors, tail_out, kScratchColumns * 4);
    for (Index j = k; j < key_count; ++j) {
      std::copy_n(tail_out + (j - k) * kScratchColumns, vectors * kTileColumns,
                  out + j * rows_stride);
    }
  }
  Tiles::release();
  if (!scaled) return;
  const Index columns = vectors * kTileColumns;
  for (Index j = 0; j < key_count; ++j) {
    float* row = out + j * rows_stride;
    for (Index c = 0; c < columns; ++c) row[c] *= scale;
  }
}

}  // namespace attn::cpu
