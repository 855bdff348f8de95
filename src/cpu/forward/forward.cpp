// The fast forward kernel: the plan's work items (cpu/plan/plan.hpp), each walked by the
// shared scorer (cpu/walk/scorer-inl.h) and its context added here. Per key tile of an item:
//   scores         S^T of each chunk by the kernel the plan names for it, shaped, and folded
//                  into the rows' online softmax (P overwrites S): the walk's
//   O = O corr + P V   rows-vectorised: P broadcast against V rows, spread over the L1
//                  sets where kWideValueRows says (cpu/tile/to_floats-inl.h, RowDistance);
//                  a tile of only narrow chunks (decoding one token) reads 16-bit K and V
//                  in place, each row only the value rows it sees; an item the plan puts
//                  on AMX tiles computes O^T = O^T corr + V^T P^T there
//                  (cpu/amx/context.hpp), or with P rounded
//                  to bf16 by vdpbf16ps (cpu/bf16_dot.hpp), V^T packed once per KV head
//                  (PackedValues, fp16 as its two parts), the context kept transposed
// Keys that causal / window hide for every row of a chunk are never computed; keys that a
// mask hides for a whole chunk are skipped too. Scores of hidden keys are overwritten with
// -inf (never added to), so their weight is exactly 0; a hidden V row with a NaN or infinity
// is skipped row by row instead of multiplied by 0. Extra memory: per thread, O(rows x (d +
// dv + key tile)) floats. A float32 weights output holds each row's shaped scores, the
// same scorer's as the weights pass's, until the row's lse makes them its weights (by the
// weights pass's rule); other dtypes go to the weights pass with this kernel's lse. With
// dropout, each chunk's weights are dropped (cpu/tile/dropout-inl.h) after the softmax has
// summed them into l and before any context path reads them, so every path drops alike.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/forward/forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/half.hpp"
#include "core/element_type.hpp"
#include "core/problem.hpp"
#include "cpu/amx/context.hpp"
#include "cpu/amx/kernels.hpp"
#include "cpu/bf16_dot.hpp"
#include "cpu/forward/forward.hpp"
#include "cpu/forward/traits.hpp"
#include "cpu/head_dim.hpp"
#include "cpu/plan/plan.hpp"
#include "cpu/threads.hpp"

#include "cpu/amx/key_parts-inl.h"
#include "cpu/amx/packed_values-inl.h"
#include "cpu/tile/bf16_pairs-inl.h"
#include "cpu/tile/context_kernels-inl.h"
#include "cpu/tile/dropout-inl.h"
#include "cpu/tile/run-inl.h"
#include "cpu/tile/target-inl.h"
#include "cpu/tile/to_floats-inl.h"
#include "cpu/tile/weight_pairs-inl.h"
#include "cpu/walk/scorer-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace {

using core::from_float;
using core::Problem;
using core::round_up;
using core::row_of;
using core::with_float_type;
using tile::scratch_buffer;
using walk::Chunk;
using walk::TileChunks;
using walk::WideScores;
using Traits = ContextTraits;
namespace hn = hwy::HWY_NAMESPACE;

// How the f32 V rows of wide tiles are read where their own distance maps them to few L1
// sets (d = 64, 128): copied to spread_row_stride on AVX2 and elsewhere, where on Zen 3 the
// copy made forward 4.6% faster at d = 128; in place on AVX-512, where on Zen 4 the copy cost
// 2-3 points of the FMA peak (bench/README.md, "f32 V in place on AVX-512"). 16-bit V is
// converted either way, so its copy keeps the spread distance.
constexpr RowDistance kWideValueRows =
    tile::kAvx512Target ? RowDistance::spread_copies : RowDistance::spread;

// A block of kContextRows rows and the keys any of them may see.
struct RowBlock {
  Index first_row = 0, rows = 0, first = 0, end = 0;
  bool skip_hidden_by_row = false;  // V holds a NaN/inf and some keys are hidden
};

// Per-thread scratch of the context, allocated before the parallel loop.
struct ContextScratch {
  ContextScratch(const Plan& plan, Index dim_v_padded, Index weight_part_words)
      : context(scratch_buffer<float>(plan.rows_per_item() * dim_v_padded)),
        values(scratch_buffer<float>(plan.key_tile() * spread_row_stride(dim_v_padded))),
        blocks(scratch_buffer<RowBlock>(plan.rows_per_item())),
        weight_parts(scratch_buffer<std::uint32_t>(weight_part_words)),
        drop_low(scratch_buffer<std::uint32_t>(plan.rows_per_item())),
        drop_high(scratch_buffer<std::uint32_t>(plan.rows_per_item())) {}

  // [rows][dim_v_padded]: unnormalised O; [dim_v_padded][rows] (O^T) for an AMX context
  hwy::AlignedFreeUniquePtr<float[]> context;
  // [key_tile][spread_row_stride(dim_v_padded)]: V tile in f32, its rows spread over the L1
  // sets for the context's column passes
  hwy::AlignedFreeUniquePtr<float[]> values;
  hwy::AlignedFreeUniquePtr<RowBlock[]> blocks;  // of the current tile (at most one per row)
  // A chunk's weights as the bf16 contexts take them (put_weight_pairs), with such a context
  hwy::AlignedFreeUniquePtr<std::uint32_t[]> weight_parts;
  // Each row's dropout bits (core::dropout_row), by row of the item, with dropout
  hwy::AlignedFreeUniquePtr<std::uint32_t[]> drop_low, drop_high;
};

// kKeep: the problem has a float32 weights output, which holds each row's shaped scores
// until its lse is known and they become its weights (finish_weights).
template <int kDim, WideScores kWide, bool kKeep>
class ItemKernel {
 public:
  ItemKernel(const Problem& problem, const Plan& plan, walk::ScorerScratch& scorer_scratch,
             ContextScratch& scratch, const KeyParts& key_parts, const PackedValues* packed)
      : p_(problem),
        plan_(plan),
        scorer_(problem, plan, scorer_scratch, key_parts),
        s_(scratch),
        packed_(packed) {}

  void run(const WorkItem& item) {
    scorer_.start(item);
    slot_ = item.segment * p_.heads_kv + item.kv_head;
    if (p_.dropout.on()) start_dropout();
    if constexpr (kWide != WideScores::float_chain) {
      switch (plan_.context_of(item)) {
        case ContextKernel::amx_tiles:
          return walk_item<ContextKernel::amx_tiles>();
        case ContextKernel::bf16_pairs:
          return walk_item<ContextKernel::bf16_pairs>();
        case ContextKernel::float_rows:
          break;
      }
    }
    walk_item<ContextKernel::float_rows>();
  }

 private:
  template <ContextKernel kContext>
  void walk_item() {
    std::fill(s_.context.get(), s_.context.get() + scorer_.rows_padded() * dim_v_padded_, 0.0f);
    if constexpr (kKeep) hide_kept_scores();
    const auto [first, end] = scorer_.item_keys();
    for (Index tile = first; tile < end; tile += plan_.key_tile()) {
      const Index tile_end = std::min<Index>(tile + plan_.key_tile(), end);
      const TileChunks chunks = scorer_.plan_tile(tile, tile_end);
      if (chunks.count == 0) continue;
      if constexpr (kContext != ContextKernel::float_rows) {
        attend_transposed<kContext>(chunks);
      } else if (plan_.narrow_tiles_in_place() && chunks.all_narrow) {
        const Index next_end = std::min<Index>(tile_end + plan_.key_tile(), end);
        with_float_type(p_.k.dtype, [&](auto tag) {
          using T = decltype(tag);
          if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
            attend_in_place<T>(chunks, tile_end, next_end);
          }
        });
      } else {
        attend(chunks, tile, tile_end);
      }
    }
    finish(kContext != ContextKernel::float_rows);
  }

  void weigh(const Chunk& chunk) {
    scorer_.score(chunk, !kKeep);
    after_scores(chunk);
  }

  // Shaping, the scores kept for a weights output, then the softmax (P overwrites S), then
  // dropout.
  void after_scores(const Chunk& chunk) {
    shape_and_keep(chunk);
    scorer_.softmax(chunk);
    if (p_.dropout.on()) drop(chunk);
  }

  void shape_and_keep(const Chunk& chunk) {
    scorer_.shape(chunk);
    if constexpr (kKeep) keep_scores(chunk);
  }

  // The item's rows' dropout bits; padding rows get zeros (their weights are never read).
  void start_dropout() {
    const Index batch = scorer_.segment().batch;
    for (Index r = 0; r < scorer_.rows_padded(); ++r) {
      core::DropoutRow row;
      if (r < scorer_.rows()) {
        row = core::dropout_row(p_.dropout.seed, batch, scorer_.head(r), scorer_.query_row(r));
      }
      s_.drop_low[r] = row.low;
      s_.drop_high[r] = row.high;
    }
  }

  // P of the chunk times dropout's factor: P V takes a kept weight times 1 / (1 - p) and
  // no dropped one, while l (summed by the softmax) keeps every weight.
  void drop(const Chunk& chunk) const {
    const tile::DF df;
    const tile::DU du;
    const auto k_begin = static_cast<std::uint32_t>(scorer_.segment().k_begin);
    for (Index c = 0; c < chunk.vectors; ++c) {
      const Index row = chunk.first_row + c * lanes_;
      const tile::VU low = hn::Load(du, s_.drop_low.get() + row);
      const tile::VU high = hn::Load(du, s_.drop_high.get() + row);
      for (Index j = chunk.first; j < chunk.end; ++j) {
        float* p = scores_at(j, row);
        const tile::VU key = hn::Set(du, k_begin + static_cast<std::uint32_t>(j));
        hn::Store(hn::Mul(hn::Load(df, p), tile::dropout_factor(low, high, key, p_.dropout)), df,
                  p);
      }
    }
  }

  // Row r of the weights output at the segment's key 0.
  float* weights_row(Index r) const {
    const core::Segment& seg = scorer_.segment();
    return row_of<float>(*p_.outputs.weights, seg.batch, scorer_.head(r), scorer_.query_row(r)) +
           seg.k_begin;
  }

  // The keys each row sees start as hidden (-inf) in the output: a chunk that a mask hides
  // for a whole tile is never scored, and its keys must weigh 0.
  void hide_kept_scores() const {
    for (Index r = 0; r < scorer_.rows(); ++r) {
      float* row = weights_row(r);
      std::fill(row + scorer_.first_key(r),
                row + std::max(scorer_.first_key(r), scorer_.end_key(r)), tile::kMinusInfinity);
    }
  }

  // The chunk's shaped scores into its rows of the weights output, four rows at a time.
  void keep_scores(const Chunk& chunk) const {
    for (Index r = chunk.first_row; r < chunk.row_end();) {
      const Index count = r + 4 <= chunk.row_end() ? 4 : 1;
      float* rows[4];
      for (Index i = 0; i < count; ++i) rows[i] = weights_row(r + i);
      scorer_.write_rows(chunk, r, count, rows);
      r += count;
    }
  }

  // Row r of the weights output, written whole: its kept scores made weights by its lse
  // (weights_of_scores, the bits the weights pass's weight_of_score gives), 0 elsewhere.
  void finish_weights(Index r, double lse) const {
    const core::Segment& seg = scorer_.segment();
    float* row = weights_row(r) - seg.k_begin;
    const Index first = seg.k_begin + scorer_.first_key(r);
    const Index end = std::max(first, seg.k_begin + scorer_.end_key(r));
    std::fill(row, row + first, 0.0f);
    tile::weights_of_scores(row + first, end - first, weight_scale_of_lse(lse), row + first);
    std::fill(row + end, row + p_.outputs.weights->shape[3], 0.0f);
  }

  // K and V widened where they must be, every chunk weighed, then P V for all of them.
  void attend(const TileChunks& chunks, Index tile_first, Index tile_end) {
    if (scorer_.reads_float_keys(chunks)) scorer_.load_keys(tile_first, tile_end);
    load_values(tile_first, tile_end, !chunks.all_narrow);
    for (Index c = 0; c < chunks.count; ++c) weigh(chunks.chunks[c]);
    const bool values_finite = !chunks.any_partial || tile_values_finite(tile_end - tile_first);
    accumulate_context(chunks, values_finite);
  }

  // Scores (K read in place, or fp16 K's parts) and O^T = O^T corr + V^T P^T, both on bf16
  // products (AMX tiles, or vdpbf16ps); no tile of K or V is widened.
  template <ContextKernel kContext>
  void attend_transposed(const TileChunks& chunks) {
    for (Index c = 0; c < chunks.count; ++c) {
      const Chunk& chunk = chunks.chunks[c];
      const PairSpan span = pair_span<kContext>(chunk);
      if (span.weights_to_pairs) {
        scorer_.score(chunk, !kKeep);
        shape_and_keep(chunk);
        softmax_to_pairs(chunk, span);
      } else {
        weigh(chunk);
      }
      rescale_transposed(chunk);
      context_on_bf16<kContext>(chunk, span);
    }
  }

  // A tile whose chunks are all narrow (decoding one token), 16-bit K and V read in place:
  // scores by the dot micro-kernel, then O = O corr + P V by tile::context_by_rows, each
  // row reading only the value rows it sees. Widening the tile into scratch first took
  // about as long as the rest of the step.
  template <class T>
  void attend_in_place(const TileChunks& chunks, Index tile_end, Index next_end) {
    const T* keys[WalkTraits::kMostTileKeys];
    const T* values[WalkTraits::kMostTileKeys];
    scorer_.stored_key_rows(tile_end, keys);
    const core::Segment& seg = scorer_.segment();
    for (Index j = scorer_.tile_first(); j < tile_end; ++j) {
      values[j - scorer_.tile_first()] =
          row_of<T>(p_.v, seg.batch, scorer_.kv_head(), seg.k_begin + j);
    }
    // Each K and V row is read once (decoding): the next tile's rows are asked to L2 while
    // this one is computed, or the step waits on memory at a fraction of its bandwidth.
    for (Index j = tile_end; j < next_end; ++j) {
      tile::prefetch_row<tile::kToL2>(
          row_of<T>(p_.k, seg.batch, scorer_.kv_head(), seg.k_begin + j),
          p_.dim_qk * static_cast<Index>(sizeof(T)));
      tile::prefetch_row<tile::kToL2>(
          row_of<T>(p_.v, seg.batch, scorer_.kv_head(), seg.k_begin + j),
          dim_v_ * static_cast<Index>(sizeof(T)));
    }
    for (Index c = 0; c < chunks.count; ++c) {
      const Chunk& chunk = chunks.chunks[c];
      scorer_.score_in_place(chunk, keys);
      after_scores(chunk);
      context_by_rows(chunk, values);
    }
  }

  // V rows of the tile as f32: the input itself when it is f32 (its rows whole vectors),
  // else converted into scratch. With wide chunks, whose context passes over a few columns of
  // V at a time for many rows, V's rows are spread over the L1 sets as kWideValueRows says;
  // narrow chunks read each V row for a few rows only, and copying f32 V there made decoding
  // steps 25-40% slower.
  void load_values(Index tile_first, Index tile_end, bool wide_context) {
    const core::Segment& seg = scorer_.segment();
    const FloatRows v = rows_as_floats(
        p_.v, seg.batch, scorer_.kv_head(), seg.k_begin + tile_first, tile_end - tile_first, dim_v_,
        dim_v_padded_, wide_context ? kWideValueRows : RowDistance::any, s_.values.get());
    values_ = v.rows;
    value_stride_ = v.stride;
  }

  bool tile_values_finite(Index keys) const {
    return tile::rows_finite(values_, keys, value_stride_, dim_v_);
  }

  float* scores_at(Index j, Index row) const { return scorer_.scores_at(j, row); }

  void accumulate_context(const TileChunks& chunks, bool values_finite) {
    RowBlock* blocks = s_.blocks.get();
    Index block_count = 0;
    for (Index c = 0; c < chunks.count; ++c) {
      const Chunk& chunk = chunks.chunks[c];
      for (Index r0 = chunk.first_row; r0 < chunk.row_end(); r0 += block_rows_) {
        RowBlock block{r0, std::min(block_rows_, chunk.row_end() - r0), chunk.end, chunk.first,
                       false};
        for (Index r = r0; r < r0 + block.rows; ++r) {
          const Index first = std::max<Index>(scorer_.first_key(r), chunk.first);
          const Index end = std::min<Index>(scorer_.end_key(r), chunk.end);
          if (first >= end) continue;
          block.first = std::min(block.first, first);
          block.end = std::max(block.end, end);
        }
        if (block.first >= block.end) continue;
        block.skip_hidden_by_row = !chunk.every_row_sees_all && !values_finite;
        blocks[block_count++] = block;
      }
    }
    const Index vectors = dim_v_padded_ / lanes_;
    for (Index v = 0; v < vectors;) {
      const Index width = tile::context_block_width(vectors - v, Traits::kContextVectors);
      for (Index b = 0; b < block_count; ++b) {
        if (!blocks[b].skip_hidden_by_row) context_columns(blocks[b], v * lanes_, width);
      }
      v += width;
    }
    for (Index b = 0; b < block_count; ++b) {
      if (blocks[b].skip_hidden_by_row) context_skipping_hidden(blocks[b]);
    }
  }

  // O = O corr + P V for a narrow chunk's real rows, V's rows read in place. Rows go four
  // at a time when they see the same keys of the tile, else one by one, so that no row
  // reads a value row it does not see (a NaN there never reaches it).
  template <class T>
  void context_by_rows(const Chunk& chunk, const T* const* values) {
    const auto range = [&](Index r) {
      return std::pair<Index, Index>{std::max<Index>(scorer_.first_key(r), chunk.first),
                                     std::min<Index>(scorer_.end_key(r), chunk.end)};
    };
    for (Index r0 = chunk.first_row; r0 < chunk.row_end(); r0 += 4) {
      const Index rows = std::min<Index>(4, chunk.row_end() - r0);
      bool same = true;
      for (Index r = r0 + 1; r < r0 + rows; ++r) same = same && range(r) == range(r0);
      if (same && rows == 4) {
        context_by_rows<T, 4>(r0, range(r0), values);
      } else if (same && rows == 2) {
        context_by_rows<T, 2>(r0, range(r0), values);
      } else {
        for (Index r = r0; r < r0 + rows; ++r) context_by_rows<T, 1>(r, range(r), values);
      }
    }
  }

  template <class T, int NR>
  void context_by_rows(Index r0, std::pair<Index, Index> keys, const T* const* values) {
    if (keys.first >= keys.second) return;
    const Index tile_first = scorer_.tile_first();
    alignas(64) float weights[NR][WalkTraits::kMostTileKeys];  // P of the tile's keys, by row
    float* acc[NR];
    const float* p[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = s_.context.get() + (r0 + r) * dim_v_padded_;
      p[r] = weights[r];
      const float rescale = scorer_.rescale()[r0 + r];
      if (rescale != 1.0f) tile::rescale_row(acc[r], dim_v_, rescale);
      for (Index j = keys.first; j < keys.second; ++j) {
        weights[r][j - tile_first] = *scores_at(j, r0 + r);
      }
    }
#if ATTN_TILE_BF16_DOT
    if constexpr (std::is_same_v<T, bfloat16>) {
      if (plan_.narrow_context_on_pairs()) {
        return context_by_pairs<NR>(acc, p, values, keys.first - tile_first,
                                    keys.second - tile_first);
      }
    }
#endif
    tile::context_by_rows<NR>(acc, p, values, keys.first - tile_first, keys.second - tile_first,
                              dim_v_);
  }

#if ATTN_TILE_BF16_DOT
  // context_by_rows on AVX512-BF16 (Plan::narrow_context_on_pairs): P rounded to bf16, keys
  // in pairs from the tile's first.
  static_assert(WalkTraits::kMostTileKeys <= tile::kMostPairedKeys, "a tile's keys in one call");
  template <int NR>
  ATTN_BF16_TARGET void context_by_pairs(float* const* acc, const float* const* p,
                                         const bfloat16* const* values, Index first,
                                         Index end) const {
    tile::context_by_pairs_bf16<NR, tile::PairedOrder::natural>(acc, p, values, 0, first, end,
                                                                dim_v_);
  }
#endif

  // A block with one real row (decoding) runs 1-row blocks, not 4 rows of which 3 pad.
  void context_columns(const RowBlock& block, Index column, Index width) {
    if (block_rows_ == Traits::kContextRows && block.rows > 1) {
      context_columns<Traits::kContextRows>(block, column, width);
    } else {
      context_columns<1>(block, column, width);
    }
  }

  template <int kRows>
  void context_columns(const RowBlock& block, Index column, Index width) {
    const float* p = scores_at(block.first, block.first_row);
    const float* v = values_ + (block.first - scorer_.tile_first()) * value_stride_ + column;
    const float* rescale = scorer_.rescale() + block.first_row;
    float* o = s_.context.get() + block.first_row * dim_v_padded_ + column;
    const Index keys = block.end - block.first;
    const Index r = scorer_.rows_padded(), vs = value_stride_, os = dim_v_padded_;
    if (width == 1)
      return tile::context_rows_vectorised<1, kRows>(p, r, 1, v, vs, keys, rescale, o, os);
    if (width == 2)
      return tile::context_rows_vectorised<2, kRows>(p, r, 1, v, vs, keys, rescale, o, os);
    tile::context_rows_vectorised<3, kRows>(p, r, 1, v, vs, keys, rescale, o, os);
  }

  void context_skipping_hidden(const RowBlock& block) {
    for (Index r = block.first_row; r < block.first_row + block.rows; ++r) {
      tile::context_skipping_zero_weights(
          scores_at(block.first, r), scorer_.rows_padded(),
          values_ + (block.first - scorer_.tile_first()) * value_stride_, value_stride_,
          block.end - block.first, scorer_.rescale()[r], s_.context.get() + r * dim_v_padded_,
          dim_v_padded_);
    }
  }

  void rescale_transposed(const Chunk& chunk) {
    for (Index c = 0; c < chunk.vectors; ++c) {
      const Index row = chunk.first_row + c * lanes_;
      tile::rescale_columns(s_.context.get() + row, scorer_.rows_padded(), dim_v_,
                            scorer_.rescale() + row);
    }
  }

  // The keys around a chunk's that a bf16 context takes (P 0 outside the chunk): whole key
  // blocks on AMX tiles, whole pairs by vdpbf16ps. values_finite: no value of the span is NaN
  // or infinite; weights_to_pairs: the softmax may put the weights straight into their
  // pairs (tile::WeightPairSink), a pass over P fewer, when the chunk starts a pair and no
  // dropout needs P as floats first.
  struct PairSpan {
    Index first = 0, end = 0;
    bool values_finite = false, weights_to_pairs = false;
  };

  template <ContextKernel kContext>
  PairSpan pair_span([[maybe_unused]] const Chunk& chunk) const {
    PairSpan span;
#if HWY_ARCH_X86
    constexpr Index kAlign = kContext == ContextKernel::amx_tiles ? kAmxKeyBlock : 2;
    span.first = chunk.first / kAlign * kAlign;
    span.end = round_up(chunk.end, kAlign);
    span.values_finite = packed_->finite_over(slot_, span.first, span.end);
    span.weights_to_pairs =
        span.values_finite && (chunk.first - span.first) % 2 == 0 && !p_.dropout.on();
#endif
    return span;
  }

  // The softmax with each vector of rows' weights put in pairs (tile::WeightPairSink), the
  // span's other pairs zeroed: what put_weight_pairs would lay from P.
  void softmax_to_pairs(const Chunk& chunk, const PairSpan& span) {
    const Index rows = chunk.vectors * lanes_, plane = (span.end - span.first) / 2 * rows;
    const Index first = chunk.first - span.first;
    std::uint32_t* pairs = s_.weight_parts.get();
    scorer_.softmax(chunk, [&](Index row) {
      return tile::WeightPairSink{pairs + first / 2 * rows + (row - chunk.first_row), rows, plane,
                                  plan_.weight_parts()};
    });
    zero_pairs_outside(first, chunk.end - span.first, span.end - span.first, rows,
                       plan_.weight_parts(), pairs);
  }

  // O^T += V^T P^T over the chunk's span, the weights in pairs (from the softmax, or laid
  // from P here). A span holding a value that is not finite goes key by key instead.
  template <ContextKernel kContext>
  void context_on_bf16([[maybe_unused]] const Chunk& chunk, [[maybe_unused]] const PairSpan& span) {
#if HWY_ARCH_X86
    if (!span.values_finite) return context_skipping_hidden_transposed(chunk);
    const Index rows = chunk.vectors * lanes_;
    const PackedValues::Slot& at = packed_->slots[static_cast<std::size_t>(slot_)];
    if (!span.weights_to_pairs) {
      tile::put_weight_pairs(scores_at(chunk.first, chunk.first_row), scorer_.rows_padded(),
                             chunk.first - span.first, chunk.end - span.first,
                             span.end - span.first, rows, plan_.weight_parts(),
                             s_.weight_parts.get());
    }
    const std::uint16_t* values_t = &packed_->values_t[at.offset + span.first].bits;
    float* out_t = s_.context.get() + chunk.first_row;
    if constexpr (kContext == ContextKernel::amx_tiles) {
      context_rows_bf16_on_tiles(values_t, at.stride, dim_v_padded_ / kAmxRows,
                                 s_.weight_parts.get(), plan_.weight_parts(), rows,
                                 span.end - span.first, static_cast<int>(chunk.vectors), out_t,
                                 scorer_.rows_padded(), packed_->parts, at.plane);
    } else {
      context_rows_bf16(values_t, at.stride, dim_v_padded_, s_.weight_parts.get(), rows,
                        span.end - span.first, static_cast<int>(chunk.vectors), out_t,
                        scorer_.rows_padded());
    }
#endif
  }

  // The chunk's real rows key by key (tile::context_skipping_zero_weights_transposed), so
  // that a NaN or infinity in V reaches only the rows that see it; fp16 V a part at a time
  // (a value not finite is all in its first part).
  void context_skipping_hidden_transposed(const Chunk& chunk) {
    const PackedValues::Slot& at = packed_->slots[static_cast<std::size_t>(slot_)];
    for (int part = 0; part < packed_->parts; ++part) {
      const bfloat16* values_t =
          packed_->values_t.get() + at.offset + part * at.plane + chunk.first;
      for (Index r = chunk.first_row; r < chunk.row_end(); ++r) {
        tile::context_skipping_zero_weights_transposed(
            scores_at(chunk.first, r), scorer_.rows_padded(), values_t, at.stride,
            chunk.end - chunk.first, s_.context.get() + r, scorer_.rows_padded(), dim_v_);
      }
    }
  }

  // context = O / l and lse = m + log(l), by the end-of-row rule (cpu/tile/state.hpp); O is
  // kept transposed after an AMX context.
  void finish(bool transposed) const {
    const core::Segment& seg = scorer_.segment();
    for (Index r = 0; r < scorer_.rows(); ++r) {
      const RowEnd<float> end = scorer_.row_end(r);
      if constexpr (kKeep) finish_weights(r, end.lse);
      const float* o = s_.context.get() + (transposed ? r : r * dim_v_padded_);
      const Index step = transposed ? scorer_.rows_padded() : 1;
      const Index b = seg.batch, h = scorer_.head(r), i = scorer_.query_row(r);
      with_float_type(p_.outputs.context.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* row = row_of<T>(p_.outputs.context, b, h, i);
        for (Index d = 0; d < dim_v_; ++d) row[d] = from_float<T>(o[d * step] * end.inverse_l);
      });
      if (!p_.outputs.lse) continue;
      const MutableTensorView& lse = *p_.outputs.lse;
      if (lse.dtype == DType::f64) {
        *row_of<double>(lse, b, h, i) = end.lse;
      } else {
        *row_of<float>(lse, b, h, i) = static_cast<float>(end.lse);
      }
    }
  }

  const Problem& p_;
  const Plan& plan_;
  walk::Scorer<kDim, kWide> scorer_;
  ContextScratch& s_;
  const PackedValues* packed_;  // V^T where the plan packs it, else null
  const Index lanes_ = tile::lanes();
  // Context blocks never straddle two row chunks: 4 rows, or 1 on the 1-lane target.
  const Index block_rows_ = lanes_ >= Traits::kContextRows ? Traits::kContextRows : 1;
  const Index dim_v_ = kDim > 0 ? kDim : p_.dim_v;
  const Index dim_v_padded_ = round_up(dim_v_, lanes_);
  Index slot_ = 0;  // the item's (segment, KV head) in PackedValues
  const float* values_ = nullptr;
  Index value_stride_ = 0;
};

template <int kDim, WideScores kWide, bool kKeep>
void run_kernel(const Problem& p, const Plan& plan, int threads) {
  const std::vector<WorkItem>& items = plan.items();
  if (items.empty()) return;
  threads = tile::threads_for(static_cast<Index>(items.size()), threads);
  std::optional<PackedValues> packed;
  if (plan.packs_values()) packed.emplace(p, threads);
  const KeyParts key_parts(p, plan, threads);
  // A chunk's weight parts over its key blocks: a tile's keys and a block on either side.
  const Index weight_part_words =
      packed ? plan.weight_parts() * (plan.key_tile() + 2 * kAmxKeyBlock) / 2 * plan.chunk_rows()
             : 0;
  const Index dim_v_padded = round_up(p.dim_v, plan.lanes());
  std::vector<walk::ScorerScratch> scorer_scratch;
  std::vector<ContextScratch> scratch;
  scorer_scratch.reserve(static_cast<std::size_t>(threads));
  scratch.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    scorer_scratch.emplace_back(plan, p.dim_qk);
    scratch.emplace_back(plan, dim_v_padded, weight_part_words);
  }
  const PackedValues* values_t = packed ? &*packed : nullptr;
  tile::run_items(static_cast<Index>(items.size()), threads, [&](int thread) {
    const auto t = static_cast<std::size_t>(thread);
    return [&, kernel = ItemKernel<kDim, kWide, kKeep>(p, plan, scorer_scratch[t], scratch[t],
                                                       key_parts, values_t)](Index i) mutable {
      kernel.run(items[static_cast<std::size_t>(i)]);
    };
  });
}

}  // namespace

// The one switch from the plan to a compiled variant: the wide chunks' scorer, whether a
// float32 weights output keeps the scores, and for the float chain without one a copy per
// common head dim (cpu/head_dim.hpp).
void ForwardTarget(const Problem& problem, int threads) {
  const Plan plan(problem, PlanTarget::of_this_cpu(tile::lanes(), tile::kAvx512Target));
  walk::with_wide_scores(plan, [&](auto wide) {
    constexpr WideScores kWide = decltype(wide)::value;
    if (keeps_weights(problem)) return run_kernel<0, kWide, true>(problem, plan, threads);
    if constexpr (kWide == WideScores::float_chain) {
      with_head_dim(problem.dim_qk, problem.dim_v, [&](auto dim) {
        run_kernel<decltype(dim)::value, kWide, false>(problem, plan, threads);
      });
    } else {
      run_kernel<0, kWide, false>(problem, plan, threads);
    }
  });
}

// The SIMD target first, as PyTorch names its cpu_capability: which code ran is what a
// report from another CPU needs.
std::string ForwardPlanTarget(const Problem& problem) {
  return std::string("target ") + hwy::TargetName(HWY_TARGET) + " (" +
         std::to_string(tile::lanes()) + " float lanes); " +
         Plan(problem, PlanTarget::of_this_cpu(tile::lanes(), tile::kAvx512Target)).describe();
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(ForwardTarget);
HWY_EXPORT(ForwardPlanTarget);

void forward(const core::Problem& problem) {
  HWY_DYNAMIC_DISPATCH(ForwardTarget)(problem, resolve_threads(problem.threads));
}

std::string describe_plan(const core::Problem& problem) {
  return HWY_DYNAMIC_DISPATCH(ForwardPlanTarget)(problem);
}

std::vector<std::int64_t> compiled_targets() {
  std::vector<std::int64_t> targets;
  for (std::int64_t left = HWY_TARGETS & hwy::SupportedTargets(); left != 0; left &= left - 1) {
    targets.push_back(left & -left);
  }
  return targets;
}

}  // namespace attn::cpu
#endif
