// The scoring half of a work item, which forward and the weights pass both walk: the item's
// rows and their key ranges, q packed as the plan's kernels take it, and per key tile the
// chunks that see a key, scored by the kernel the plan names for each, shaped and masked
// (the tile core's shaper, lanes being rows) and folded into each row's online softmax (P
// overwrites S). Forward adds P V; the weights pass turns the same scores into weights
// (include this header after foreach_target.h).
//
// A compile-time variant, chosen once per call at with_wide_scores: how wide chunks are
// scored (float chains from Qt; bf16 pairs from K in place; fp16 parts from K's split), so
// no path flag is tested inside the tile walk.
#if defined(ATTN_CPU_WALK_SCORER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_WALK_SCORER_INL_H_
#undef ATTN_CPU_WALK_SCORER_INL_H_
#else
#define ATTN_CPU_WALK_SCORER_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/block_mask.hpp"
#include "attn/half.hpp"
#include "core/block_masking.hpp"
#include "core/element_type.hpp"
#include "core/mask.hpp"
#include "core/problem.hpp"
#include "core/visible_keys.hpp"
#include "cpu/amx/fp16_parts.hpp"
#include "cpu/amx/kernels.hpp"
#include "cpu/amx/scores.hpp"
#include "cpu/bf16_dot.hpp"
#include "cpu/plan/plan.hpp"
#include "cpu/plan/traits.hpp"
#include "cpu/tile/state.hpp"

#include "cpu/amx/key_parts-inl.h"
#include "cpu/tile/bf16_pairs-inl.h"
#include "cpu/tile/run-inl.h"
#include "cpu/tile/score_kernels-inl.h"
#include "cpu/tile/shaping-inl.h"
#include "cpu/tile/softmax-inl.h"
#include "cpu/tile/target-inl.h"
#include "cpu/tile/to_floats-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace walk {

namespace hn = hwy::HWY_NAMESPACE;
using core::row_of;
using tile::DF;
using tile::DI;
using tile::kMinusInfinity;
using tile::scratch_buffer;
using tile::VF;

// The compile-time variant of the walk: what wide chunks are scored from.
enum class WideScores : std::uint8_t {
  float_chain,  // Qt (scale * q transposed) against float32 K rows
  bf16_pairs,   // bf16 q as the dot instruction pairs it, against bf16 K in place (vdpbf16ps
                // or AMX tiles, as the plan names)
  fp16_parts,   // fp16 q as its bf16 parts, against K's parts (KeyParts), on AMX tiles
};

// Calls fn(std::integral_constant<WideScores, ...>) for the plan's wide kernel: the one
// switch from the plan to a compiled variant. The paired variants exist on AVX-512 targets
// only, where the plan may name them.
template <class Fn>
void with_wide_scores(const Plan& plan, Fn&& fn) {
  if constexpr (tile::kAvx512Target) {
    switch (plan.wide_scores()) {
      case ScoreKernel::bf16_pairs:
      case ScoreKernel::bf16_tiles:
        return fn(std::integral_constant<WideScores, WideScores::bf16_pairs>{});
      case ScoreKernel::fp16_parts:
        return fn(std::integral_constant<WideScores, WideScores::fp16_parts>{});
      default:
        break;
    }
  }
  fn(std::integral_constant<WideScores, WideScores::float_chain>{});
}

// A chunk of an item's rows (the plan's ChunkRows) and the keys [first, end) of the current
// tile that any of its rows may see.
struct Chunk {
  Index first_row = 0, vectors = 0, rows = 0;
  ScoreKernel scores = ScoreKernel::float_chain;
  Index first = 0, end = 0;
  bool every_row_sees_all = false;  // no per-key hiding needed in [first, end)
  bool masked = false;              // the mask's per-key pass is needed in [first, end)

  bool narrow() const { return scores_by_dot(scores); }
  Index row_end() const { return first_row + rows; }
};

// The chunks of one tile that see some key (at most one per chunk of the item).
struct TileChunks {
  const Chunk* chunks = nullptr;
  Index count = 0;
  bool any_partial = false, any_narrow = false, all_narrow = true;
};

// Per-thread scratch of the scorer, for an item of up to `rows` rows (tile::scratch_buffer).
struct ScorerScratch {
  ScorerScratch(const Plan& plan, Index dim)
      : queries_t(scratch_buffer<float>(
            plan.wide_scores() == ScoreKernel::float_chain ? dim * plan.rows_per_item() : 0)),
        query_pairs(scratch_buffer<std::uint16_t>(pair_elements(plan, dim))),
        rows_finite(scratch_buffer<std::uint8_t>(plan.rows_per_item())),
        queries(scratch_buffer<float>(dim * plan.rows_per_item())),
        query_bf16(scratch_buffer<bfloat16>(
            plan.narrow_scores() == ScoreKernel::dot_bf16 ? dim * plan.rows_per_item() : 0)),
        scores(scratch_buffer<float>((plan.key_tile() + WalkTraits::kScoreKeys) *
                                     plan.rows_per_item())),
        keys(scratch_buffer<float>(plan.key_tile() * dim)),
        row_max(scratch_buffer<float>(plan.rows_per_item())),
        row_sum(scratch_buffer<float>(plan.rows_per_item())),
        rescale(scratch_buffer<float>(plan.rows_per_item())),
        slope(scratch_buffer<float>(plan.rows_per_item())),
        first_key(scratch_buffer<std::int32_t>(plan.rows_per_item())),
        end_key(scratch_buffer<std::int32_t>(plan.rows_per_item())),
        position(scratch_buffer<std::int32_t>(plan.rows_per_item())),
        bias_start(scratch_buffer<std::int32_t>(plan.rows_per_item())),
        head(scratch_buffer<Index>(plan.rows_per_item())),
        query_row(scratch_buffer<Index>(plan.rows_per_item())),
        chunks(scratch_buffer<Chunk>(plan.rows_per_item())) {}

  // bf16 pairs [dim / 2][rows][2]; fp16 parts [2][dim][rows][2]; none for float chains.
  static Index pair_elements(const Plan& plan, Index dim) {
    switch (plan.wide_scores()) {
      case ScoreKernel::bf16_pairs:
      case ScoreKernel::bf16_tiles:
        return core::round_up(dim, 2) * plan.rows_per_item();
      case ScoreKernel::fp16_parts:
        return 4 * dim * plan.rows_per_item();
      default:
        return 0;
    }
  }

  hwy::AlignedFreeUniquePtr<float[]> queries_t;            // [dim][rows]: scale * q, transposed
  hwy::AlignedFreeUniquePtr<std::uint16_t[]> query_pairs;  // q for the paired kernels
  hwy::AlignedFreeUniquePtr<std::uint8_t[]> rows_finite;   // [rows], fp16 parts: q finite
  hwy::AlignedFreeUniquePtr<float[]> queries;        // [rows][dim]: scale * q, for narrow chunks
  hwy::AlignedFreeUniquePtr<bfloat16[]> query_bf16;  // [rows][dim]: q, for dot_bf16 chunks
  hwy::AlignedFreeUniquePtr<float[]> scores;         // [key_tile + score_keys][rows]: S^T, then P^T
  hwy::AlignedFreeUniquePtr<float[]> keys;           // [key_tile][dim]: K tile in f32 (f16/bf16 k)
  hwy::AlignedFreeUniquePtr<float[]> row_max, row_sum, rescale, slope;     // [rows]
  hwy::AlignedFreeUniquePtr<std::int32_t[]> first_key, end_key, position;  // [rows]
  hwy::AlignedFreeUniquePtr<std::int32_t[]> bias_start;  // [rows]: core::BiasByOffset::start
  hwy::AlignedFreeUniquePtr<Index[]> head, query_row;    // [rows]
  hwy::AlignedFreeUniquePtr<Chunk[]> chunks;             // of the current tile
};

template <int kDim, WideScores kWide>
class Scorer {
 public:
  Scorer(const core::Problem& problem, const Plan& plan, ScorerScratch& scratch,
         const KeyParts& key_parts)
      : p_(problem), plan_(plan), s_(scratch), key_parts_(key_parts) {}

  // Takes up an item: its rows, their key ranges and starting states (the sink, or empty),
  // and q packed for the plan's kernels.
  void start(const WorkItem& item) {
    seg_ = &p_.segments[static_cast<std::size_t>(item.segment)];
    kv_head_ = item.kv_head;
    rows_ = item.positions * p_.group_size();
    rows_padded_ = core::round_up(rows_, lanes_);
    if (chunk_rows_.empty() || chunks_of_rows_ != rows_) chunk_rows_ = plan_.chunks(rows_);
    chunks_of_rows_ = rows_;
    set_up_rows(item);
    find_mask_rows();
    pack_queries();
  }

  // Keys [first, end) some row of the item sees (first >= end: none); the item's tiles
  // start at `first`, plan.key_tile() apart.
  std::pair<Index, Index> item_keys() const {
    Index first = std::numeric_limits<Index>::max(), end = 0;
    for (Index r = 0; r < rows_; ++r) {
      if (s_.first_key[r] >= s_.end_key[r]) continue;
      first = std::min<Index>(first, s_.first_key[r]);
      end = std::max<Index>(end, s_.end_key[r]);
    }
    return {first, end};
  }

  // The chunks that see a key of the tile [tile_first, tile_end): each narrowed to the keys
  // any of its rows may see; a chunk that sees none (or that a mask hides from them all) is
  // left out.
  TileChunks plan_tile(Index tile_first, Index tile_end) {
    tile_first_ = tile_first;
    TileChunks out;
    out.chunks = s_.chunks.get();
    if (!blocks_show_any(tile_first, tile_end)) return out;
    for (const ChunkRows& rows : chunk_rows_) {
      Chunk chunk{rows.first_row, rows.vectors, rows.rows, rows.scores};
      if (!plan_chunk(tile_first, tile_end, chunk)) continue;
      out.any_partial |= !chunk.every_row_sees_all;
      out.any_narrow |= chunk.narrow();
      out.all_narrow &= chunk.narrow();
      s_.chunks[out.count++] = chunk;
    }
    return out;
  }

  // Whether a block of keys [first, end) that some row of the item reads is not empty
  // (always, without a block mask): a tile the mask hides from every row is not planned,
  // at the cost of a few lookups instead of a pass over the rows.
  bool blocks_show_any(Index first, Index end) const {
    if (p_.mask_kind != core::MaskKind::blocks) return true;
    const BlockMask& mask = *p_.block_mask;
    const Index size = mask.block_size();
    for (const auto& [head, qb] : mask_rows_) {
      for (Index kb = first / size; kb * size < end; ++kb) {
        if (mask.block(seg_->sequence, head, qb, kb) != BlockMask::Block::empty) return true;
      }
    }
    return false;
  }

  // K rows of the tile as float32 (the input itself for f32 K, else widened into scratch),
  // for the chunks that score from them: float chains and dot products.
  void load_keys(Index tile_first, Index tile_end) {
    const FloatRows k =
        rows_as_floats(p_.k, seg_->batch, kv_head_, seg_->k_begin + tile_first,
                       tile_end - tile_first, dim_, dim_, RowDistance::any, s_.keys.get());
    keys_ = k.rows;
    key_stride_ = k.stride;
  }
  // Whether a tile's chunks read float32 K rows (load_keys): float dot chunks do, and wide
  // chunks of the float chain.
  bool reads_float_keys(const TileChunks& tile) const {
    return kWide == WideScores::float_chain ||
           (tile.any_narrow && plan_.narrow_scores() == ScoreKernel::dot);
  }

  // Pointers to the tile's K rows as stored, for tiles of narrow chunks read in place.
  template <class T>
  void stored_key_rows(Index tile_end, const T** keys) const {
    for (Index j = tile_first_; j < tile_end; ++j) {
      keys[j - tile_first_] = row_of<T>(p_.k, seg_->batch, kv_head_, seg_->k_begin + j);
    }
  }

  // S^T of the chunk by its kernel: dot chunks from the float32 K rows of load_keys, wide
  // chunks by the variant's kernel. With softmax_scales (a caller whose next read of S^T is
  // softmax()), AMX tiles leave the scale of a chunk that shape() leaves alone to softmax(),
  // which multiplies each score as it reads it: a pass fewer over S^T, the same bits.
  void score(const Chunk& chunk, bool softmax_scales = false) {
    deferred_scale_ = 0.0f;
    if (chunk.scores == ScoreKernel::dot_bf16) {
      const bfloat16* keys[WalkTraits::kMostTileKeys];
      stored_key_rows(chunk.end, keys);
      return score_by_dot_bf16(chunk, keys);
    }
    if (chunk.narrow()) return score_by_dot(chunk, [&](Index j) { return key_row(j); });
    if constexpr (kWide == WideScores::float_chain) {
      if (chunk.vectors == 1) return score_float_chains<1>(chunk);
      if (chunk.vectors == 2) return score_float_chains<2>(chunk);
      score_float_chains<WalkTraits::kScoreRowVectors>(chunk);
    } else if constexpr (kWide == WideScores::bf16_pairs) {
      const auto scale = static_cast<float>(p_.rule.scale);
      // scale > 0: the max of the scaled scores is then the scaled max of the scores.
      if (softmax_scales && plan_.wide_scores() == ScoreKernel::bf16_tiles && scale > 0.0f &&
          !reshapes(chunk) && !chunk.masked) {
        deferred_scale_ = scale;
      }
      score_bf16_pairs(chunk);
    } else {
      score_fp16_parts(chunk);
    }
  }

  // S^T of a narrow chunk from K's rows as stored (stored_key_rows).
  template <class T>
  void score_in_place(const Chunk& chunk, const T* const* keys) {
    if constexpr (std::is_same_v<T, bfloat16>) {
      if (chunk.scores == ScoreKernel::dot_bf16) return score_by_dot_bf16(chunk, keys);
    }
    score_by_dot(chunk, [&](Index j) { return keys[j - tile_first_]; });
  }

  // The shared shaper, lanes being rows: softcap, ALiBi, the position bias, keys outside a
  // row's causal/window range, then the mask.
  void shape(const Chunk& chunk) {
    if (reshapes(chunk)) {
      if (chunk.every_row_sees_all) {
        shape_chunk<false>(chunk);
      } else {
        shape_chunk<true>(chunk);
      }
    }
    if (!chunk.masked) return;
    if (p_.mask_kind == core::MaskKind::blocks) {
      apply_block_mask(chunk);
    } else {
      apply_mask(chunk);
    }
  }

  // The shared online softmax, lanes being rows; P overwrites S, and rescale[r] =
  // exp(m_old - m_new) is left for the context. A scale that score() left is used up here.
  void softmax(const Chunk& chunk) {
    softmax(chunk, [&](Index row) {
      return tile::WeightsInPlace{scores_at(chunk.first, row), rows_padded_};
    });
  }

  // softmax() with P put where put_of(row) says for the vector of rows at `row`
  // (tile::online_softmax_rows' Put), S left as it was.
  template <class PutOf>
  void softmax(const Chunk& chunk, const PutOf& put_of) {
    const float deferred_scale = std::exchange(deferred_scale_, 0.0f);
    for (Index c = 0; c < chunk.vectors; ++c) {
      const Index row = chunk.first_row + c * lanes_;
      tile::online_softmax_rows(scores_at(chunk.first, row), chunk.end - chunk.first, rows_padded_,
                                s_.row_max.get() + row, s_.row_sum.get() + row,
                                s_.rescale.get() + row, deferred_scale, put_of(row));
    }
  }

  // Rows r .. r + count - 1 (count 1, or 4) of the chunk's S^T (scores, or the weights that
  // replaced them) into output rows: out[i][j] = S^T[j][r + i] over the keys j of the chunk
  // that row sees, in the output's dtype (out[i]: the row at the segment's key 0). Four rows
  // take their common keys by 4 x 4 transposes into a float32 output: a strided copy took
  // longer than the exp of the weights.
  template <class T>
  void write_rows(const Chunk& chunk, Index r, Index count, T* const* out) const {
    Index common_first = chunk.first, common_end = chunk.end;
    for (Index i = 0; i < count; ++i) {
      common_first = std::max<Index>(common_first, s_.first_key[r + i]);
      common_end = std::min<Index>(common_end, s_.end_key[r + i]);
    }
    const bool transposed = kFourLanes && std::is_same_v<T, float> && count == 4;
    if (!transposed || common_first >= common_end) common_end = common_first;
    common_end = common_first + (common_end - common_first) / 4 * 4;
    for (Index i = 0; i < count; ++i) {
      const Index first = std::max<Index>(s_.first_key[r + i], chunk.first);
      const Index end = std::min<Index>(s_.end_key[r + i], chunk.end);
      for (Index j = first; j < std::min(end, common_first); ++j) {
        out[i][j] = core::from_float<T>(*scores_at(j, r + i));
      }
      for (Index j = std::max(first, common_end); j < end; ++j) {
        out[i][j] = core::from_float<T>(*scores_at(j, r + i));
      }
    }
    if constexpr (std::is_same_v<T, float>) {
      if (transposed) write_transposed(r, common_first, common_end, out);
    }
  }

  // Row r's end: its context factor 1 / l and its lse (end_of_row).
  RowEnd<float> row_end(Index r) const { return end_of_row(s_.row_max[r], s_.row_sum[r]); }

  float* scores_at(Index j, Index row) const {
    return s_.scores.get() + (j - tile_first_) * rows_padded_ + row;
  }
  Index rows() const { return rows_; }
  Index rows_padded() const { return rows_padded_; }
  Index tile_first() const { return tile_first_; }
  const core::Segment& segment() const { return *seg_; }
  Index kv_head() const { return kv_head_; }
  Index first_key(Index r) const { return s_.first_key[r]; }
  Index end_key(Index r) const { return s_.end_key[r]; }
  Index head(Index r) const { return s_.head[r]; }
  Index query_row(Index r) const { return s_.query_row[r]; }
  const float* rescale() const { return s_.rescale.get(); }

 private:
  // Per row: its head, its query, and the keys [first_key, end_key) that causal and the
  // window leave visible; the online-softmax state starts at the sink (or empty).
  void set_up_rows(const WorkItem& item) {
    const Index group = p_.group_size();
    for (Index t = 0; t < item.positions; ++t) {
      const Index i = item.first_position + t;
      const Index position = p_.query_position(*seg_, i);
      const core::KeyRange keys = p_.rule.visible_keys(position, seg_->len_k);
      for (Index g = 0; g < group; ++g) {
        const Index r = t * group + g, head = kv_head_ * group + g;
        s_.head[r] = head;
        s_.query_row[r] = seg_->q_begin + i;
        s_.first_key[r] = static_cast<std::int32_t>(keys.first);
        s_.end_key[r] = static_cast<std::int32_t>(keys.end);
        s_.position[r] = static_cast<std::int32_t>(position);
        s_.slope[r] = p_.rule.alibi_slopes.empty() ? 0.0f : p_.rule.alibi_slopes[head];
        s_.bias_start[r] = static_cast<std::int32_t>(p_.bias_by_offset.start(head));
        const float sink = p_.sinks.empty() ? kMinusInfinity : p_.sinks[head];
        s_.row_max[r] = sink;
        s_.row_sum[r] = sink == kMinusInfinity ? 0.0f : 1.0f;
      }
    }
    for (Index r = rows_; r < rows_padded_; ++r) {
      s_.head[r] = kv_head_ * group;
      s_.query_row[r] = seg_->q_begin;
      s_.first_key[r] = s_.end_key[r] = s_.position[r] = 0;
      s_.slope[r] = 0.0f;
      s_.bias_start[r] = static_cast<std::int32_t>(p_.bias_by_offset.start(s_.head[r]));
      s_.row_max[r] = kMinusInfinity;
      s_.row_sum[r] = 0.0f;
    }
  }

  // Q[r] = scale * q[head r][query r] (tile::scaled_query) for narrow chunks, and for wide
  // ones its transpose Qt[d][r], or q's own bf16 pairs, or its fp16 parts; padding rows 0.
  void pack_queries() {
    if (plan_.narrow_scores() == ScoreKernel::dot_bf16) {
      for (Index r = 0; r < rows_; ++r) {
        std::copy_n(query_of<bfloat16>(r), dim_, s_.query_bf16.get() + r * dim_);
      }
    }
    const auto scale = static_cast<float>(p_.rule.scale);
    core::with_float_type(p_.q.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        for (Index r = 0; r < rows_; ++r) {
          tile::scaled_query(query_of<T>(r), dim_, scale, s_.queries.get() + r * dim_);
        }
      }
    });
    if constexpr (kWide == WideScores::float_chain) {
      float* qt = s_.queries_t.get();
      for (Index r = 0; r < rows_; ++r) {
        const float* q = s_.queries.get() + r * dim_;
        for (Index d = 0; d < dim_; ++d) qt[d * rows_padded_ + r] = q[d];
      }
      for (Index d = 0; d < dim_; ++d) {
        std::fill(qt + d * rows_padded_ + rows_, qt + (d + 1) * rows_padded_, 0.0f);
      }
    } else if constexpr (kWide == WideScores::bf16_pairs) {
      std::uint16_t* pairs = s_.query_pairs.get();
      std::fill(pairs, pairs + core::round_up(dim_, 2) * rows_padded_, std::uint16_t{0});
      for (Index r = 0; r < rows_; ++r) {
        put_query_pairs(query_of<bfloat16>(r), dim_, r, rows_padded_, pairs);
      }
    } else {
      std::uint16_t* pairs = s_.query_pairs.get();
      std::fill(pairs, pairs + 4 * dim_ * rows_padded_, std::uint16_t{0});
      std::fill(s_.rows_finite.get(), s_.rows_finite.get() + rows_padded_, std::uint8_t{1});
      alignas(64) float q[kAmxMaxDim];
      for (Index r = 0; r < rows_; ++r) {
        to_floats(query_of<float16>(r), dim_, q);
        s_.rows_finite[r] = put_query_parts(q, dim_, r, rows_padded_, pairs);
      }
    }
  }

  template <class T>
  const T* query_of(Index r) const {
    return row_of<T>(p_.q, seg_->batch, s_.head[r], s_.query_row[r]);
  }

  bool plan_chunk(Index tile_first, Index tile_end, Chunk& chunk) const {
    chunk.first = tile_end;
    chunk.end = tile_first;
    for (Index r = chunk.first_row; r < chunk.row_end(); ++r) {
      const Index first = std::max<Index>(s_.first_key[r], tile_first);
      const Index end = std::min<Index>(s_.end_key[r], tile_end);
      if (first >= end) continue;
      chunk.first = std::min(chunk.first, first);
      chunk.end = std::max(chunk.end, end);
    }
    if (chunk.first >= chunk.end) return false;
    chunk.masked = p_.mask_kind != core::MaskKind::none;
    if (p_.mask_kind == core::MaskKind::blocks && !cover_blocks(chunk)) return false;
    bool sees_all = !chunk.masked;
    for (Index r = chunk.first_row; r < chunk.row_end() && sees_all; ++r) {
      sees_all = s_.first_key[r] <= chunk.first && s_.end_key[r] >= chunk.end;
    }
    // Narrow scores leave padding rows unwritten; hiding them needs the per-key pass.
    chunk.every_row_sees_all = sees_all && !chunk.narrow();
    return p_.mask_kind == core::MaskKind::none || p_.mask_kind == core::MaskKind::blocks ||
           mask_shows_any(chunk);
  }

  // The (head, query block) pairs of the block mask that the item's rows read.
  void find_mask_rows() {
    mask_rows_.clear();
    if (p_.mask_kind != core::MaskKind::blocks) return;
    const BlockMask& mask = *p_.block_mask;
    for (Index r = 0; r < rows_; ++r) {
      const std::pair<Index, Index> key{mask.heads() == 1 ? 0 : s_.head[r],
                                        (s_.query_row[r] - seg_->q_begin) / mask.block_size()};
      if (std::find(mask_rows_.begin(), mask_rows_.end(), key) == mask_rows_.end()) {
        mask_rows_.push_back(key);
      }
    }
  }

  // Narrows the chunk to the key blocks where some row meets a block that is not empty
  // (false: none, the chunk is skipped), and leaves the per-key pass off when every block
  // its rows see keys of there is full. Rows go in runs of one (mask head, query block),
  // which read the same blocks: one lookup per run and key block, over the run's keys.
  bool cover_blocks(Chunk& chunk) const {
    const BlockMask& mask = *p_.block_mask;
    const Index size = mask.block_size();
    const Index kb_first = chunk.first / size, kb_end = (chunk.end - 1) / size + 1;
    constexpr Index kMostBlocks = WalkTraits::kMostTileKeys / BlockMask::kMinBlockSize + 1;
    // Per key block: some run sees keys there; one meets a block that is not empty; every
    // one that sees keys there meets a full block.
    std::array<bool, kMostBlocks> seen{}, used{}, full{};
    full.fill(true);
    const auto query_block = [&](Index r) { return (s_.query_row[r] - seg_->q_begin) / size; };
    for (Index r = chunk.first_row; r < chunk.row_end();) {
      const Index head = s_.head[r], qb = query_block(r);
      Index first = chunk.end, end = chunk.first;
      for (;
           r < chunk.row_end() && (mask.heads() == 1 || s_.head[r] == head) && query_block(r) == qb;
           ++r) {
        first = std::min<Index>(first, std::max<Index>(s_.first_key[r], chunk.first));
        end = std::max<Index>(end, std::min<Index>(s_.end_key[r], chunk.end));
      }
      for (Index kb = first / size; first < end && kb * size < end; ++kb) {
        const BlockMask::Block block = mask.block(seg_->sequence, head, qb, kb);
        const auto at = static_cast<std::size_t>(kb - kb_first);
        seen[at] = true;
        used[at] = used[at] || block != BlockMask::Block::empty;
        full[at] = full[at] && block == BlockMask::Block::full;
      }
    }
    Index used_first = kb_end, used_end = kb_first;
    for (Index kb = kb_first; kb < kb_end; ++kb) {
      if (!used[static_cast<std::size_t>(kb - kb_first)]) continue;
      used_first = std::min(used_first, kb);
      used_end = kb + 1;
    }
    if (used_first >= used_end) return false;
    chunk.first = std::max(chunk.first, used_first * size);
    chunk.end = std::min(chunk.end, used_end * size);
    // A block seen but empty between two used ones is hidden by the per-key pass.
    bool all_full = true;
    for (Index kb = used_first; kb < used_end; ++kb) {
      const auto at = static_cast<std::size_t>(kb - kb_first);
      all_full = all_full && (!seen[at] || (used[at] && full[at]));
    }
    chunk.masked = !all_full;
    return true;
  }

  bool mask_shows_any(const Chunk& chunk) const {
    bool shown = false;
    core::with_element_type(p_.mask.dtype, [&](auto tag) {
      using M = decltype(tag);
      for (Index r = chunk.first_row; r < chunk.row_end() && !shown; ++r) {
        shown = core::mask_shows_any(mask_row<M>(r), std::max<Index>(s_.first_key[r], chunk.first),
                                     std::min<Index>(s_.end_key[r], chunk.end));
      }
    });
    return shown;
  }

  template <class M>
  const M* mask_row(Index r) const {
    return row_of<M>(p_.mask, seg_->batch, s_.head[r], s_.query_row[r]) + seg_->k_begin;
  }

  const float* key_row(Index j) const { return keys_ + (j - tile_first_) * key_stride_; }

  template <int C>
  void score_float_chains(const Chunk& chunk) {
    constexpr int kKeys = WalkTraits::kScoreKeys;
    const float* qt = s_.queries_t.get() + chunk.first_row;
    Index j = chunk.first;
    for (; j + kKeys <= chunk.end; j += kKeys) {
      const float* keys[kKeys];
      for (int k = 0; k < kKeys; ++k) keys[k] = key_row(j + k);
      tile::scores_rows_vectorised<kDim, C, kKeys>(qt, rows_padded_, keys, dim_,
                                                   scores_at(j, chunk.first_row));
    }
    for (; j < chunk.end; ++j) {
      const float* keys[1] = {key_row(j)};
      tile::scores_rows_vectorised<kDim, C, 1>(qt, rows_padded_, keys, dim_,
                                               scores_at(j, chunk.first_row));
    }
  }

  // S^T = scale K Q^T by bf16 products, K's bf16 rows read in place: on AMX tiles or by
  // vdpbf16ps, as the plan names.
  void score_bf16_pairs([[maybe_unused]] const Chunk& chunk) {
#if HWY_ARCH_X86
    const std::uint16_t* q = s_.query_pairs.get() + chunk.first_row * 2;
    const std::uint16_t* k =
        &row_of<bfloat16>(p_.k, seg_->batch, kv_head_, seg_->k_begin + chunk.first)->bits;
    const auto vectors = static_cast<int>(chunk.vectors);
    const auto scale = static_cast<float>(p_.rule.scale);
    float* out = scores_at(chunk.first, chunk.first_row);
    if (plan_.wide_scores() == ScoreKernel::bf16_tiles) {
      return scores_rows_bf16_on_tiles(q, rows_padded_, k, p_.k.strides[2], chunk.end - chunk.first,
                                       dim_, scale, vectors, out, deferred_scale_ == 0.0f);
    }
    scores_rows_bf16(q, rows_padded_, k, p_.k.strides[2], chunk.end - chunk.first, dim_, scale,
                     vectors, out);
#endif
  }

  // S^T = scale K Q^T of fp16 q and k on AMX tiles, from their parts.
  void score_fp16_parts([[maybe_unused]] const Chunk& chunk) {
#if HWY_ARCH_X86
    const Index key = seg_->k_begin + chunk.first;
    scores_rows_fp16(s_.query_pairs.get() + chunk.first_row * 2,
                     s_.rows_finite.get() + chunk.first_row, rows_padded_,
                     key_parts_.parts_of(seg_->batch, kv_head_, key),
                     key_parts_.finite_of(seg_->batch, kv_head_, key), chunk.end - chunk.first,
                     dim_, static_cast<float>(p_.rule.scale), static_cast<int>(chunk.vectors),
                     scores_at(chunk.first, chunk.first_row));
#endif
  }

  // S^T[j][r] = q_r . k_j for the chunk's real rows by the dot micro-kernel, up to four rows
  // a block so that each key row is read once for all of them; key_row(j) is key j's row
  // (float, or a 16-bit row read in place).
  template <class KeyRow>
  void score_by_dot(const Chunk& chunk, const KeyRow& key_row) {
    for (Index r = chunk.first_row; r < chunk.row_end(); r += 4) {
      switch (std::min<Index>(4, chunk.row_end() - r)) {
        case 4:
          score_by_dot<4>(chunk, r, key_row);
          break;
        case 3:
          score_by_dot<3>(chunk, r, key_row);
          break;
        case 2:
          score_by_dot<2>(chunk, r, key_row);
          break;
        default:
          score_by_dot<1>(chunk, r, key_row);
      }
    }
  }

  template <int NR, class KeyRow>
  void score_by_dot(const Chunk& chunk, Index r0, const KeyRow& key_row) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(key_row(Index{0}))>>;
    constexpr Index kKeys = tile::kDotKeys<NR>;
    const float* q[NR];
    for (int r = 0; r < NR; ++r) q[r] = s_.queries.get() + (r0 + r) * dim_;
    for (Index j = chunk.first; j < chunk.end; j += kKeys) {
      const Index keys = std::min(kKeys, chunk.end - j);
      const T* k[kKeys];
      for (Index i = 0; i < kKeys; ++i) k[i] = key_row(j + std::min(i, keys - 1));
      float dots[NR][kKeys];
      float* out[NR];
      for (int r = 0; r < NR; ++r) out[r] = dots[r];
      tile::scores_by_dot<NR>(q, k, dim_, out);
      for (int r = 0; r < NR; ++r)
        for (Index i = 0; i < keys; ++i) *scores_at(j + i, r0 + r) = dots[r][i];
    }
  }

  // score_by_dot for dot_bf16 chunks: q's bf16 rows against the tile's bf16 K rows as
  // stored (keys[j - tile_first]), the scale after the sums. The plan names dot_bf16 only
  // where ATTN_TILE_BF16_DOT holds; elsewhere the body is empty, as score_bf16_pairs' is.
  ATTN_BF16_TARGET void score_by_dot_bf16([[maybe_unused]] const Chunk& chunk,
                                          [[maybe_unused]] const bfloat16* const* keys) {
#if ATTN_TILE_BF16_DOT
    for (Index r = chunk.first_row; r < chunk.row_end(); r += 4) {
      switch (std::min<Index>(4, chunk.row_end() - r)) {
        case 4:
          score_by_dot_bf16<4>(chunk, r, keys);
          break;
        case 3:
          score_by_dot_bf16<3>(chunk, r, keys);
          break;
        case 2:
          score_by_dot_bf16<2>(chunk, r, keys);
          break;
        default:
          score_by_dot_bf16<1>(chunk, r, keys);
      }
    }
#endif
  }

#if ATTN_TILE_BF16_DOT
  template <int NR>
  ATTN_BF16_TARGET HWY_INLINE void score_by_dot_bf16(const Chunk& chunk, Index r0,
                                                     const bfloat16* const* keys) {
    constexpr Index kKeys = tile::kDotKeys<NR>;
    const auto scale = static_cast<float>(p_.rule.scale);
    const bfloat16* q[NR];
    for (int r = 0; r < NR; ++r) q[r] = s_.query_bf16.get() + (r0 + r) * dim_;
    for (Index j = chunk.first; j < chunk.end; j += kKeys) {
      const Index count = std::min(kKeys, chunk.end - j);
      const bfloat16* k[kKeys];
      for (Index i = 0; i < kKeys; ++i) k[i] = keys[j + std::min(i, count - 1) - tile_first_];
      float dots[NR][kKeys];
      float* out[NR];
      for (int r = 0; r < NR; ++r) out[r] = dots[r];
      tile::scores_by_dot_bf16<NR>(q, k, dim_, scale, out);
      for (int r = 0; r < NR; ++r)
        for (Index i = 0; i < count; ++i) *scores_at(j + i, r0 + r) = dots[r][i];
    }
  }
#endif

  template <bool kHide>
  void shape_chunk(const Chunk& chunk) {
    const DF df;
    const DI di;
    for (Index c = 0; c < chunk.vectors; ++c) {
      const Index row = chunk.first_row + c * lanes_;
      const auto first = hn::Load(di, s_.first_key.get() + row);
      const auto end = hn::Load(di, s_.end_key.get() + row);
      const auto position = hn::Load(di, s_.position.get() + row);
      const VF slope = hn::Load(df, s_.slope.get() + row);
      const auto bias_start = hn::Load(di, s_.bias_start.get() + row);
      for (Index j = chunk.first; j < chunk.end; ++j) {
        float* at = scores_at(j, row);
        const auto key = hn::Set(di, static_cast<std::int32_t>(j));
        hn::Store(tile::shape_scores<kHide>(shaping_, hn::Load(df, at), key, position, slope,
                                            bias_start, first, end),
                  df, at);
      }
    }
  }

  // Whether shape() changes scores other than by the mask.
  bool reshapes(const Chunk& chunk) const {
    return shaping_.softcap || shaping_.alibi || shaping_.bias != nullptr ||
           !chunk.every_row_sees_all;
  }

  void apply_mask(const Chunk& chunk) {
    core::with_element_type(p_.mask.dtype, [&](auto tag) {
      using M = decltype(tag);
      for (Index r = chunk.first_row; r < chunk.row_end(); ++r) {
        tile::mask_scores(mask_row<M>(r), chunk.first, chunk.end, scores_at(chunk.first, r),
                          rows_padded_);
      }
    });
  }

  void apply_block_mask(const Chunk& chunk) {
    for (Index r = chunk.first_row; r < chunk.row_end(); ++r) {
      core::hide_by_blocks(*p_.block_mask, seg_->sequence, s_.head[r],
                           s_.query_row[r] - seg_->q_begin, chunk.first, chunk.end,
                           scores_at(chunk.first, r), rows_padded_);
    }
  }

#if HWY_TARGET == HWY_SCALAR
  static constexpr bool kFourLanes = false;
  void write_transposed(Index, Index, Index, float* const*) const {}
#else
  static constexpr bool kFourLanes = true;
  // out[i][j] = S^T[j][r + i] for keys [first, end) (a multiple of 4 apart), i < 4.
  void write_transposed(Index r, Index first, Index end, float* const* out) const {
    const hn::CappedTag<float, 4> d4;
    const hn::Repartition<std::uint64_t, decltype(d4)> d64;
    for (Index j = first; j < end; j += 4) {
      const auto k0 = hn::LoadU(d4, scores_at(j, r));
      const auto k1 = hn::LoadU(d4, scores_at(j + 1, r));
      const auto k2 = hn::LoadU(d4, scores_at(j + 2, r));
      const auto k3 = hn::LoadU(d4, scores_at(j + 3, r));
      const auto low01 = hn::BitCast(d64, hn::InterleaveLower(d4, k0, k1));
      const auto low23 = hn::BitCast(d64, hn::InterleaveLower(d4, k2, k3));
      const auto high01 = hn::BitCast(d64, hn::InterleaveUpper(d4, k0, k1));
      const auto high23 = hn::BitCast(d64, hn::InterleaveUpper(d4, k2, k3));
      hn::StoreU(hn::BitCast(d4, hn::InterleaveLower(d64, low01, low23)), d4, out[0] + j);
      hn::StoreU(hn::BitCast(d4, hn::InterleaveUpper(d64, low01, low23)), d4, out[1] + j);
      hn::StoreU(hn::BitCast(d4, hn::InterleaveLower(d64, high01, high23)), d4, out[2] + j);
      hn::StoreU(hn::BitCast(d4, hn::InterleaveUpper(d64, high01, high23)), d4, out[3] + j);
    }
  }
#endif

  const core::Problem& p_;
  const Plan& plan_;
  ScorerScratch& s_;
  const KeyParts& key_parts_;  // fp16 K's parts where the plan splits keys, else empty
  const tile::ScoreShaping shaping_{p_.rule.softcap, !p_.rule.alibi_slopes.empty(),
                                    p_.bias_by_offset};
  const Index lanes_ = tile::lanes();
  const Index dim_ = kDim > 0 ? kDim : p_.dim_qk;
  const core::Segment* seg_ = nullptr;
  Index kv_head_ = 0, rows_ = 0, rows_padded_ = 0, tile_first_ = 0;
  std::vector<ChunkRows> chunk_rows_;  // the plan's chunks of an item of chunks_of_rows_ rows
  std::vector<std::pair<Index, Index>> mask_rows_;  // find_mask_rows
  Index chunks_of_rows_ = 0;
  const float* keys_ = nullptr;
  Index key_stride_ = 0;
  float deferred_scale_ = 0.0f;  // the scale score() left to softmax(), or 0
};

}  // namespace walk
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
