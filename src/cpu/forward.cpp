// The fast forward kernel. Work items are (segment, KV head, block of query positions);
// an item's rows are every query head sharing the KV head at each of its positions, so
// each K/V tile is read once for the whole GQA group. For each key tile, per chunk of
// rows, with the pieces of cpu/tile/:
//   S^T = K Q^T    rows-vectorised: keys broadcast against query rows packed transposed
//                  (Qt, once per item), so K needs no packing when it is f32;
//                  a chunk of few rows (decoding one token) uses the dot kernel instead,
//                  and a tile of only such chunks reads 16-bit K and V in place;
//                  bf16 q and k on a CPU with AVX512-BF16 go through its dot-product
//                  instruction, or AMX tiles where it has them (cpu/bf16_dot.hpp), K read
//                  in place; fp16 q and k on a CPU with AMX go on tiles as their exact
//                  bf16 parts (cpu/amx/fp16_parts.hpp), K split once per call (KeyParts)
//   shaping        the shared score shaper, lanes being rows
//   softmax        the shared online softmax, vectorised over rows; P overwrites S
//   O = O corr + P V   rows-vectorised: P broadcast against V rows, which lie far enough
//                  apart to spread over the L1 sets (f32 rows that do not are copied
//                  into scratch: cpu/tile/to_floats-inl.h, RowDistance); with bf16 (or fp16)
//                  V after scores on tiles, O^T = O^T corr + V^T P^T on tiles instead
//                  (cpu/amx/context.hpp), V^T packed once per KV head (PackedValues, fp16
//                  as its two parts), the context kept transposed
//   weights        for a float32 weights output (keeps_weights): the shaped scores are
//                  kept by row in scratch before the softmax, and when a row ends they
//                  go into the output as its weights, by its lse
// Keys that causal / window hide for every row of a chunk are never computed; keys that
// a mask hides for a whole chunk are skipped too. Scores of hidden keys are overwritten
// with -inf (never added to), so their weight is exactly 0; a hidden V row with a NaN or
// infinity is skipped row by row instead of multiplied by 0. Extra memory: per thread,
// O(rows x (d + dv + key tile)) floats, and with a weights output rows x Lk (an item's
// share of that output).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/half.hpp"
#include "core/element_type.hpp"
#include "core/mask.hpp"
#include "core/problem.hpp"
#include "core/visible_keys.hpp"
#include "cpu/amx/context.hpp"
#include "cpu/amx/scores.hpp"
#include "cpu/amx/tiles.hpp"
#include "cpu/amx/kernels.hpp"
#include "cpu/bf16_dot.hpp"
#include "cpu/forward.hpp"
#include "cpu/forward_traits.hpp"
#include "cpu/amx/fp16_parts.hpp"
#include "cpu/head_dim.hpp"
#include "cpu/threads.hpp"

#include "cpu/amx/key_parts-inl.h"
#include "cpu/tile/context_kernels-inl.h"
#include "cpu/tile/run-inl.h"
#include "cpu/tile/score_kernels-inl.h"
#include "cpu/tile/shaping-inl.h"
#include "cpu/tile/softmax-inl.h"
#include "cpu/tile/target-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace {

using core::from_float;
using core::mask_hides;
using core::MaskKind;
using core::Problem;
using core::round_up;
using core::row_of;
using core::Segment;
using core::with_element_type;
using core::with_float_type;
using tile::DF;
using tile::DI;
using tile::kMinusInfinity;
using tile::scratch_buffer;
using tile::VF;
namespace hn = hwy::HWY_NAMESPACE;

// One unit of parallel work; its result depends on nothing else, so any thread count
// gives the same bits.
struct WorkItem {
  Index segment = 0, kv_head = 0, first_position = 0, positions = 0;
};

// V^T in bf16 for the context on AMX tiles, packed before the items once per (segment, KV
// head), a slot: [parts][dim_v_padded][keys_padded] with keys_padded the segment's keys in
// whole key blocks (32), zeros past its keys and value dims, parts 1 for bf16 V and 2 for
// fp16 V (its exact bf16 parts, cpu/amx/fp16_parts.hpp); and per key block whether its values
// are all finite (a block that is not goes through context_skipping_hidden_transposed, so
// that a weight of 0 never meets a NaN).
struct PackedValues {
  struct Slot {
    Index offset = 0, keys_padded = 0, first_block = 0, plane = 0;  // plane: one part's size
  };
  int parts = 1;
  std::vector<Slot> slots;
  hwy::AlignedFreeUniquePtr<bfloat16[]> values_t;
  std::vector<unsigned char> finite;

  bool finite_over(Index slot, Index first_key, Index end_key) const {
    const Slot& at = slots[static_cast<std::size_t>(slot)];
    for (Index b = first_key / kAmxKeyBlock; b < end_key / kAmxKeyBlock; ++b) {
      if (!finite[static_cast<std::size_t>(at.first_block + b)]) return false;
    }
    return true;
  }
};

// Rows per KV head, at least, for the AMX context: below, packing V^T costs as much as the
// products it serves.
constexpr Index kAmxContextMinRows = 64;

// bf16 parts of a value in PackedValues: 1 for bf16 V, 2 for fp16 V.
int value_parts(const Problem& p) {
  return p.v.dtype == DType::f16 ? 2 : 1;
}

// Whether forward multiplies P V on AMX tiles: scores on tiles (bf16 q and k by
// scores_by_bf16_dot on an AVX-512 target with amx_scores_fit, or fp16 q and k by
// scores_by_fp16_parts) and V of the same dtype, a CPU with AMX, enough rows, V^T in bounds.
bool uses_amx_context(const Problem& p) {
  const bool bf16 = scores_by_bf16_dot(p, tile::kAvx512Target) && p.v.dtype == DType::bf16 &&
                    amx_scores_fit(p.dim_qk) && has_amx();
  const bool fp16 = scores_by_fp16_parts(p, tile::kAvx512Target) && p.v.dtype == DType::f16;
  if (!bf16 && !fp16) return false;
  bool enough_rows = false;
  Index packed_bytes = 0;
  for (const Segment& segment : p.segments) {
    enough_rows |= segment.len_q * p.group_size() >= kAmxContextMinRows;
    packed_bytes += 2 * value_parts(p) * p.heads_kv * round_up(p.dim_v, kAmxRows) *
                    round_up(segment.len_k, kAmxKeyBlock);
  }
  return enough_rows && packed_bytes <= kAmxPackedMaxBytes;
}

PackedValues pack_values(const Problem& p, int threads) {
  PackedValues packed;
  packed.parts = value_parts(p);
  const Index dim_v_padded = round_up(p.dim_v, kAmxRows);
  Index total = 0, blocks = 0;
  for (const Segment& segment : p.segments) {
    const Index keys_padded = round_up(segment.len_k, kAmxKeyBlock);
    for (Index h = 0; h < p.heads_kv; ++h) {
      packed.slots.push_back({total, keys_padded, blocks, dim_v_padded * keys_padded});
      total += packed.parts * dim_v_padded * keys_padded;
      blocks += keys_padded / kAmxKeyBlock;
    }
  }
  packed.values_t = scratch_buffer<bfloat16>(total);
  packed.finite.assign(static_cast<std::size_t>(blocks), 1);
  const auto pack_slot = [&](Index slot) {
    const Segment& segment = p.segments[static_cast<std::size_t>(slot / p.heads_kv)];
    const PackedValues::Slot& at = packed.slots[static_cast<std::size_t>(slot)];
    bfloat16* values_t = packed.values_t.get() + at.offset;
    std::fill(values_t, values_t + packed.parts * at.plane, bfloat16{});
    const Index kv_head = slot % p.heads_kv;
    // fp16: a row's values, then its parts (high, low), before they are scattered into V^T.
    std::vector<float> row(packed.parts == 2 ? static_cast<std::size_t>(p.dim_v) : 0);
    std::vector<std::uint16_t> parts(2 * row.size());
    for (Index k = 0; k < segment.len_k; ++k) {
      bool finite = true;
      bfloat16* column = values_t + k;
      if (packed.parts == 2) {
        to_floats(row_of<float16>(p.v, segment.batch, kv_head, segment.k_begin + k), p.dim_v,
                  row.data());
        finite = put_parts<1>(row.data(), p.dim_v, parts.data(), parts.data() + p.dim_v);
        for (Index d = 0; d < p.dim_v; ++d) {
          column[d * at.keys_padded] = bfloat16{parts[static_cast<std::size_t>(d)]};
          column[at.plane + d * at.keys_padded] =
              bfloat16{parts[static_cast<std::size_t>(p.dim_v + d)]};
        }
      } else {
        const bfloat16* v = row_of<bfloat16>(p.v, segment.batch, kv_head, segment.k_begin + k);
        for (Index d = 0; d < p.dim_v; ++d) {
          column[d * at.keys_padded] = v[d];
          finite &= (v[d].bits & 0x7F80u) != 0x7F80u;
        }
      }
      if (!finite) packed.finite[static_cast<std::size_t>(at.first_block + k / kAmxKeyBlock)] = 0;
    }
  };
  tile::run_items(static_cast<Index>(packed.slots.size()),
                  tile::threads_for(static_cast<Index>(packed.slots.size()), threads),
                  [&](int) { return pack_slot; });
  return packed;
}

// A chunk of up to kScoreRowVectors row vectors and the keys [first, end) of the current
// tile that any of its rows may see.
struct Chunk {
  Index first_row = 0, vectors = 0, first = 0, end = 0;
  bool every_row_sees_all = false;  // no per-key hiding needed in [first, end)
  bool narrow = false;  // few real rows: scores by dot products, not by broadcasting keys
};

// A block of kContextRows rows and the keys any of them may see.
struct RowBlock {
  Index first_row = 0, rows = 0, first = 0, end = 0;
  bool skip_hidden_by_row = false;  // V holds a NaN/inf and some keys are hidden
};

// Per-thread scratch, allocated before the parallel loop (tile::scratch_buffer).
struct Scratch {
  Scratch(Index rows, Index dim, Index dim_v_padded, Index key_tile, Index score_keys,
          Index kept_rows, Index kept_keys, Index weight_part_words, bool fp16_parts)
      : kept_stride(kept_keys),
        queries_t(scratch_buffer<float>(dim * rows)),
        query_pairs(
            scratch_buffer<std::uint16_t>((fp16_parts ? 4 * dim : round_up(dim, 2)) * rows)),
        rows_finite(scratch_buffer<std::uint8_t>(fp16_parts ? rows : 0)),
        queries(scratch_buffer<float>(dim * rows)),
        scores(scratch_buffer<float>((key_tile + score_keys) * rows)),
        context(scratch_buffer<float>(rows * dim_v_padded)),
        keys(scratch_buffer<float>(key_tile * dim)),
        values(scratch_buffer<float>(key_tile * spread_row_stride(dim_v_padded))),
        row_max(scratch_buffer<float>(rows)),
        row_sum(scratch_buffer<float>(rows)),
        rescale(scratch_buffer<float>(rows)),
        slope(scratch_buffer<float>(rows)),
        first_key(scratch_buffer<std::int32_t>(rows)),
        end_key(scratch_buffer<std::int32_t>(rows)),
        position(scratch_buffer<std::int32_t>(rows)),
        head(scratch_buffer<Index>(rows)),
        query_row(scratch_buffer<Index>(rows)),
        chunks(scratch_buffer<Chunk>(rows)),
        blocks(scratch_buffer<RowBlock>(rows)),
        kept_scores(scratch_buffer<float>(kept_rows * kept_keys)),
        weight_parts(scratch_buffer<std::uint32_t>(weight_part_words)) {}

  Index kept_stride;  // the longest segment's keys with a weights output, else 0

  hwy::AlignedFreeUniquePtr<float[]> queries_t;  // [dim][rows]: scale * q, transposed
  // [dim / 2][rows][2]: bf16 q (unscaled) as the bf16 dot pairs it (cpu/bf16_dot.hpp); for
  // fp16 parts [2][dim][rows][2] (put_query_parts, cpu/amx/fp16_parts.hpp)
  hwy::AlignedFreeUniquePtr<std::uint16_t[]> query_pairs;
  hwy::AlignedFreeUniquePtr<std::uint8_t[]> rows_finite;  // [rows], fp16 parts only: q finite
  hwy::AlignedFreeUniquePtr<float[]> queries;  // [rows][dim]: scale * q, for narrow chunks
  hwy::AlignedFreeUniquePtr<float[]> scores;   // [key_tile + score_keys][rows]: S^T, then P^T
  // [rows][dim_v_padded]: unnormalised O; [dim_v_padded][rows] (O^T) for an AMX context
  hwy::AlignedFreeUniquePtr<float[]> context;
  hwy::AlignedFreeUniquePtr<float[]> keys;  // [key_tile][dim]: K tile in f32 (f16/bf16 k)
  // [key_tile][spread_row_stride(dim_v_padded)]: V tile in f32, its rows spread over the L1
  // sets for the context's column passes
  hwy::AlignedFreeUniquePtr<float[]> values;
  hwy::AlignedFreeUniquePtr<float[]> row_max, row_sum, rescale, slope;     // [rows]
  hwy::AlignedFreeUniquePtr<std::int32_t[]> first_key, end_key, position;  // [rows]
  hwy::AlignedFreeUniquePtr<Index[]> head, query_row;                      // [rows]
  hwy::AlignedFreeUniquePtr<Chunk[]> chunks;     // of the current tile (at most one per row)
  hwy::AlignedFreeUniquePtr<RowBlock[]> blocks;  // of the current tile (at most one per row)
  // [kept_rows][kept_stride]: each real row's shaped scores over its segment's keys, for the
  // weights output
  hwy::AlignedFreeUniquePtr<float[]> kept_scores;
  // A chunk's weights as the AMX context takes them (put_weight_parts), with an AMX context
  hwy::AlignedFreeUniquePtr<std::uint32_t[]> weight_parts;
};

template <int kDim>
class ItemKernel {
  using Traits = ForwardTraits<kDim>;

 public:
  ItemKernel(const Problem& problem, Scratch& scratch, const PackedValues* packed,
             const KeyParts& key_parts)
      : p_(problem), s_(scratch), packed_(packed), key_parts_(&key_parts) {}

  void run(const WorkItem& item) {
    seg_ = &p_.segments[static_cast<std::size_t>(item.segment)];
    kv_head_ = item.kv_head;
    const Index group = p_.group_size();
    rows_ = item.positions * group;
    rows_padded_ = round_up(rows_, lanes_);
    slot_ = item.segment * p_.heads_kv + item.kv_head;
    amx_context_ = packed_ != nullptr && !has_narrow_chunk();
    set_up_rows(item);
    pack_queries();
    std::fill(s_.context.get(), s_.context.get() + rows_padded_ * dim_v_padded_, 0.0f);

    Index first = std::numeric_limits<Index>::max(), end = 0;
    for (Index r = 0; r < rows_; ++r) {
      if (s_.first_key[r] >= s_.end_key[r]) continue;
      first = std::min<Index>(first, s_.first_key[r]);
      end = std::max<Index>(end, s_.end_key[r]);
    }
    for (Index tile = first; tile < end; tile += Traits::kKeyTile) {
      attend_tile(tile, std::min<Index>(tile + Traits::kKeyTile, end));
    }
    finish();
  }

 private:
  // Whether a chunk of the item's rows is narrow (chunk_scored_by_dot): those read the
  // context by rows, so the item keeps it untransposed, off AMX.
  bool has_narrow_chunk() const {
    const Index chunk_rows = Traits::kScoreRowVectors * lanes_;
    for (Index first = 0; first < rows_; first += chunk_rows) {
      if (chunk_scored_by_dot(std::min(rows_, first + chunk_rows) - first, lanes_)) return true;
    }
    return false;
  }

  // Per row: its head, its query, and the keys [first_key, end_key) that causal and the
  // window leave visible; the online-softmax state starts at the sink (or empty).
  void set_up_rows(const WorkItem& item) {
    const Index group = p_.group_size();
    for (Index t = 0; t < item.positions; ++t) {
      const Index i = item.first_position + t;
      const Index position = p_.query_position(*seg_, i);
      const core::KeyRange keys = core::visible_keys(p_.causal, p_.window, position, seg_->len_k);
      for (Index g = 0; g < group; ++g) {
        const Index r = t * group + g, head = kv_head_ * group + g;
        s_.head[r] = head;
        s_.query_row[r] = seg_->q_begin + i;
        s_.first_key[r] = static_cast<std::int32_t>(keys.first);
        s_.end_key[r] = static_cast<std::int32_t>(keys.end);
        s_.position[r] = static_cast<std::int32_t>(position);
        s_.slope[r] = p_.alibi_slopes.empty() ? 0.0f : p_.alibi_slopes[head];
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
      s_.row_max[r] = kMinusInfinity;
      s_.row_sum[r] = 0.0f;
    }
  }

  // Q[r] = scale * q[head r][query r] (tile::scaled_query), and Qt[d][r] its transpose, or
  // for the bf16 dot q's own pairs; padding rows are 0.
  void pack_queries() {
    float* qt = s_.queries_t.get();
    const auto scale = static_cast<float>(p_.scale);
    with_float_type(p_.q.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        for (Index r = 0; r < rows_; ++r) {
          float* q = s_.queries.get() + r * dim_;
          tile::scaled_query(row_of<T>(p_.q, seg_->batch, s_.head[r], s_.query_row[r]), dim_, scale,
                             q);
          if (!paired_scores_) {
            for (Index d = 0; d < dim_; ++d) qt[d * rows_padded_ + r] = q[d];
          }
        }
      }
    });
    if (paired_scores_) return pack_query_pairs();
    for (Index d = 0; d < dim_; ++d) {
      std::fill(qt + d * rows_padded_ + rows_, qt + (d + 1) * rows_padded_, 0.0f);
    }
  }

  // q in bf16 as the dot instruction pairs it (put_query_pairs, rows_padded rows per pair
  // of d), or as fp16 parts (put_query_parts); padding rows are 0.
  void pack_query_pairs() {
    std::uint16_t* pairs = s_.query_pairs.get();
    if (fp16_parts_) {
      std::fill(pairs, pairs + 4 * dim_ * rows_padded_, std::uint16_t{0});
      std::fill(s_.rows_finite.get(), s_.rows_finite.get() + rows_padded_, std::uint8_t{1});
      alignas(64) float q[kAmxMaxDim];
      for (Index r = 0; r < rows_; ++r) {
        to_floats(row_of<float16>(p_.q, seg_->batch, s_.head[r], s_.query_row[r]), dim_, q);
        s_.rows_finite[r] = put_query_parts(q, dim_, r, rows_padded_, pairs);
      }
      return;
    }
    std::fill(pairs, pairs + dim_ * rows_padded_, std::uint16_t{0});
    for (Index r = 0; r < rows_; ++r) {
      put_query_pairs(row_of<bfloat16>(p_.q, seg_->batch, s_.head[r], s_.query_row[r]), dim_, r,
                      rows_padded_, pairs);
    }
  }

  void attend_tile(Index tile_first, Index tile_end) {
    tile_first_ = tile_first;
    Chunk* chunks = s_.chunks.get();
    Index chunk_count = 0;
    bool any_partial = false, any_narrow = false, all_narrow = true;
    const Index vectors = rows_padded_ / lanes_;
    for (Index v = 0; v < vectors; v += Traits::kScoreRowVectors) {
      Chunk chunk;
      chunk.first_row = v * lanes_;
      chunk.vectors = std::min<Index>(Traits::kScoreRowVectors, vectors - v);
      if (plan_chunk(tile_first, tile_end, chunk)) {
        any_partial |= !chunk.every_row_sees_all;
        any_narrow |= chunk.narrow;
        all_narrow &= chunk.narrow;
        chunks[chunk_count++] = chunk;
      } else if (keep_weights_) {
        hide_in_weights(chunk, tile_first, tile_end);
      }
    }
    if (chunk_count == 0) return;
    if (amx_context_) return attend_tile_on_tiles(chunks, chunk_count);
    if (narrow_in_place_ && all_narrow) {
      return with_float_type(p_.k.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
          attend_narrow_tile<T>(chunks, chunk_count, tile_end);
        }
      });
    }
    load_tile(tile_first, tile_end, !paired_scores_ || any_narrow, !all_narrow);
    for (Index c = 0; c < chunk_count; ++c) {
      compute_scores(chunks[c]);
      weigh_scores(chunks[c]);
    }
    const bool values_finite = !any_partial || tile_values_finite(tile_end - tile_first);
    accumulate_context(chunks, chunk_count, values_finite);
  }

  // bf16 scores (K read in place, or fp16 K's parts) and O^T = O^T corr + V^T P^T, both on
  // AMX tiles; no tile of K or V is widened.
  void attend_tile_on_tiles(const Chunk* chunks, Index chunk_count) {
    for (Index c = 0; c < chunk_count; ++c) {
      compute_scores(chunks[c]);
      weigh_scores(chunks[c]);
      rescale_transposed(chunks[c]);
      context_on_tiles(chunks[c]);
    }
  }

  void rescale_transposed(const Chunk& chunk) {
    for (Index c = 0; c < chunk.vectors; ++c) {
      const Index row = chunk.first_row + c * lanes_;
      tile::rescale_columns(s_.context.get() + row, rows_padded_, dim_v_, s_.rescale.get() + row);
    }
  }

  // O^T += V^T P^T over the whole key blocks around the chunk's keys, P 0 outside them; a
  // span holding a value that is not finite goes key by key instead.
  void context_on_tiles([[maybe_unused]] const Chunk& chunk) {
#if HWY_ARCH_X86
    const Index span_first = chunk.first / kAmxKeyBlock * kAmxKeyBlock;
    const Index span_end = round_up(chunk.end, kAmxKeyBlock);
    if (!packed_->finite_over(slot_, span_first, span_end)) {
      return context_skipping_hidden_transposed(chunk);
    }
    const Index rows = chunk.vectors * lanes_;
    const PackedValues::Slot& at = packed_->slots[static_cast<std::size_t>(slot_)];
    put_weight_parts(scores_at(chunk.first, chunk.first_row), rows_padded_,
                     chunk.first - span_first, chunk.end - span_first, span_end - span_first, rows,
                     rows, s_.weight_parts.get());
    context_rows_bf16(&packed_->values_t[at.offset + span_first].bits, at.keys_padded,
                      dim_v_padded_ / kAmxRows, s_.weight_parts.get(), rows, span_end - span_first,
                      static_cast<int>(chunk.vectors), s_.context.get() + chunk.first_row,
                      rows_padded_, packed_->parts, at.plane);
#endif
  }

  // The chunk's real rows key by key (the tile core, cpu/tile/), so that a NaN or infinity in V reaches
  // only the rows that see it; fp16 V a part at a time (a value not finite is all in its
  // first part).
  void context_skipping_hidden_transposed(const Chunk& chunk) {
    const PackedValues::Slot& at = packed_->slots[static_cast<std::size_t>(slot_)];
    const Index row_end = std::min(rows_, chunk.first_row + chunk.vectors * lanes_);
    for (int part = 0; part < packed_->parts; ++part) {
      const bfloat16* values_t =
          packed_->values_t.get() + at.offset + part * at.plane + chunk.first;
      for (Index r = chunk.first_row; r < row_end; ++r) {
        tile::context_skipping_zero_weights_transposed(
            scores_at(chunk.first, r), rows_padded_, values_t, at.keys_padded,
            chunk.end - chunk.first, s_.context.get() + r, rows_padded_, dim_v_);
      }
    }
  }

  // A tile whose chunks are all narrow (decoding one token), 16-bit K and V read in place:
  // scores by the dot micro-kernel, then O = O corr + P V by tile::context_by_rows, each
  // row reading only the value rows it sees. Widening the tile into scratch first took
  // about as long as the rest of the step.
  template <class T>
  void attend_narrow_tile(const Chunk* chunks, Index chunk_count, Index tile_end) {
    const T* keys[Traits::kKeyTile];
    const T* values[Traits::kKeyTile];
    for (Index j = tile_first_; j < tile_end; ++j) {
      keys[j - tile_first_] = row_of<T>(p_.k, seg_->batch, kv_head_, seg_->k_begin + j);
      values[j - tile_first_] = row_of<T>(p_.v, seg_->batch, kv_head_, seg_->k_begin + j);
    }
    for (Index c = 0; c < chunk_count; ++c) {
      compute_scores_by_dot(chunks[c], [&](Index j) { return keys[j - tile_first_]; });
      weigh_scores(chunks[c]);
      context_by_rows(chunks[c], values);
    }
  }

  // Narrows the chunk to the keys of [tile_first, tile_end) any of its rows may see;
  // false when there are none (or a mask hides them all).
  bool plan_chunk(Index tile_first, Index tile_end, Chunk& chunk) const {
    const Index row_end = std::min(rows_, chunk.first_row + chunk.vectors * lanes_);
    chunk.first = tile_end;
    chunk.end = tile_first;
    for (Index r = chunk.first_row; r < row_end; ++r) {
      const Index first = std::max<Index>(s_.first_key[r], tile_first);
      const Index end = std::min<Index>(s_.end_key[r], tile_end);
      if (first >= end) continue;
      chunk.first = std::min(chunk.first, first);
      chunk.end = std::max(chunk.end, end);
    }
    if (chunk.first >= chunk.end) return false;
    bool sees_all = p_.mask_kind == MaskKind::none;
    for (Index r = chunk.first_row; r < row_end && sees_all; ++r) {
      sees_all = s_.first_key[r] <= chunk.first && s_.end_key[r] >= chunk.end;
    }
    chunk.narrow = chunk_scored_by_dot(row_end - chunk.first_row, lanes_);
    // Narrow scores leave padding rows unwritten; hiding them needs the per-key pass.
    chunk.every_row_sees_all = sees_all && !chunk.narrow;
    return p_.mask_kind == MaskKind::none || mask_shows_any(chunk, row_end);
  }

  bool mask_shows_any(const Chunk& chunk, Index row_end) const {
    bool shown = false;
    with_element_type(p_.mask.dtype, [&](auto tag) {
      using M = decltype(tag);
      for (Index r = chunk.first_row; r < row_end && !shown; ++r) {
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

  // K (when scores are made from float keys) and V rows of the tile as f32: the inputs
  // themselves when they are f32 (V's rows whole vectors), else converted into scratch.
  // The bf16 dot reads K's own rows, fp16 parts K's parts (KeyParts). With wide chunks, whose
  // context passes over a few columns of V at a time for many rows, V's rows must also lie far
  // enough apart to spread over the L1 sets (RowDistance::spread); narrow chunks read each V row
  // for a few rows only, and copying f32 V there made decoding steps 25-40% slower.
  void load_tile(Index tile_first, Index tile_end, bool float_keys, bool wide_context) {
    const Index keys = tile_end - tile_first, first_key = seg_->k_begin + tile_first;
    if (float_keys) {
      const FloatRows k = rows_as_floats(p_.k, seg_->batch, kv_head_, first_key, keys, dim_, dim_,
                                         RowDistance::any, s_.keys.get());
      keys_ = k.rows;
      key_stride_ = k.stride;
    }
    const FloatRows v =
        rows_as_floats(p_.v, seg_->batch, kv_head_, first_key, keys, dim_v_, dim_v_padded_,
                       wide_context ? RowDistance::spread : RowDistance::any, s_.values.get());
    values_ = v.rows;
    value_stride_ = v.stride;
  }

  bool tile_values_finite(Index keys) const {
    return tile::rows_finite(values_, keys, value_stride_, dim_v_);
  }

  const float* key_row(Index j) const {
    return keys_ + (j - tile_first_) * key_stride_;
  }
  float* scores_at(Index j, Index row) const {
    return s_.scores.get() + (j - tile_first_) * rows_padded_ + row;
  }

  void compute_scores(const Chunk& chunk) {
    if (chunk.narrow) return compute_scores_by_dot(chunk, [&](Index j) { return key_row(j); });
    if (chunk.vectors == 1) return compute_scores<1>(chunk);
    if (chunk.vectors == 2) return compute_scores<2>(chunk);
    compute_scores<Traits::kScoreRowVectors>(chunk);
  }

  template <int C>
  void compute_scores(const Chunk& chunk) {
    if (fp16_parts_) return compute_scores_fp16(chunk, C);
    if (bf16_dot_) return compute_scores_bf16(chunk, C);
    constexpr int kKeys = Traits::kScoreKeys;
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

  // S^T = scale K Q^T by bf16 dot products, reading K's bf16 rows in place.
  void compute_scores_bf16([[maybe_unused]] const Chunk& chunk, [[maybe_unused]] int vectors) {
#if HWY_ARCH_X86
    scores_rows_bf16(
        s_.query_pairs.get() + chunk.first_row * 2, rows_padded_,
        &row_of<bfloat16>(p_.k, seg_->batch, kv_head_, seg_->k_begin + chunk.first)->bits,
        p_.k.strides[2], chunk.end - chunk.first, dim_, static_cast<float>(p_.scale), vectors,
        scores_at(chunk.first, chunk.first_row));
#endif
  }

  // S^T = scale K Q^T of fp16 q and k on AMX tiles, from their parts.
  void compute_scores_fp16([[maybe_unused]] const Chunk& chunk, [[maybe_unused]] int vectors) {
#if HWY_ARCH_X86
    const Index key = seg_->k_begin + chunk.first;
    scores_rows_fp16(
        s_.query_pairs.get() + chunk.first_row * 2, s_.rows_finite.get() + chunk.first_row,
        rows_padded_, key_parts_->parts_of(seg_->batch, kv_head_, key),
        key_parts_->finite_of(seg_->batch, kv_head_, key), chunk.end - chunk.first, dim_,
        static_cast<float>(p_.scale), vectors, scores_at(chunk.first, chunk.first_row));
#endif
  }

  // S^T[j][r] = q_r . k_j for the chunk's real rows, by the dot micro-kernel, up to four rows
  // a block so that each key row is read once for all of them; key_row(j) is key j's row
  // (float, or a 16-bit row read in place).
  template <class KeyRow>
  void compute_scores_by_dot(const Chunk& chunk, const KeyRow& key_row) {
    const Index row_end = std::min(rows_, chunk.first_row + chunk.vectors * lanes_);
    for (Index r = chunk.first_row; r < row_end; r += 4) {
      switch (std::min<Index>(4, row_end - r)) {
        case 4:
          scores_by_dot<4>(chunk, r, key_row);
          break;
        case 3:
          scores_by_dot<3>(chunk, r, key_row);
          break;
        case 2:
          scores_by_dot<2>(chunk, r, key_row);
          break;
        default:
          scores_by_dot<1>(chunk, r, key_row);
      }
    }
  }

  template <int NR, class KeyRow>
  void scores_by_dot(const Chunk& chunk, Index r0, const KeyRow& key_row) {
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
      tile::scores_by_dot<T, NR>(q, k, dim_, out);
      for (int r = 0; r < NR; ++r)
        for (Index i = 0; i < keys; ++i) *scores_at(j + i, r0 + r) = dots[r][i];
    }
  }

  // The shaper of the tile core, lanes being rows: softcap, ALiBi, keys outside a row's
  // causal/window range, then the mask.
  void shape_scores(const Chunk& chunk) {
    const tile::ScoreShaping& shaping = shaping_;
    if (shaping.softcap || shaping.alibi || !chunk.every_row_sees_all) {
      if (chunk.every_row_sees_all) {
        shape_chunk<false>(chunk);
      } else {
        shape_chunk<true>(chunk);
      }
    }
    if (p_.mask_kind != MaskKind::none) apply_mask(chunk);
  }

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
      for (Index j = chunk.first; j < chunk.end; ++j) {
        float* at = scores_at(j, row);
        const auto key = hn::Set(di, static_cast<std::int32_t>(j));
        hn::Store(
            tile::shape_scores<kHide>(shaping_, hn::Load(df, at), key, position, slope, first, end),
            df, at);
      }
    }
  }

  void apply_mask(const Chunk& chunk) {
    const Index row_end = std::min(rows_, chunk.first_row + chunk.vectors * lanes_);
    with_element_type(p_.mask.dtype, [&](auto tag) {
      using M = decltype(tag);
      for (Index r = chunk.first_row; r < row_end; ++r) {
        tile::mask_scores(mask_row<M>(r), chunk.first, chunk.end, scores_at(chunk.first, r),
                          rows_padded_);
      }
    });
  }

  // Row r's kept scores, by key of the segment.
  float* kept_row(Index r) const {
    return s_.kept_scores.get() + r * s_.kept_stride;
  }

  // The chunk's shaped scores, kept by row (keys [first, end) of the chunk; those a row
  // does not see are -inf there, and finish_weights passes over them).
  void keep_scores(const Chunk& chunk) const {
    const Index row_end = std::min(rows_, chunk.first_row + chunk.vectors * lanes_);
    for (Index r = chunk.first_row; r < row_end; ++r) {
      float* kept = kept_row(r) + chunk.first;
      const float* s = scores_at(chunk.first, r);
      for (Index j = 0; j < chunk.end - chunk.first; ++j) kept[j] = s[j * rows_padded_];
    }
  }

  // A chunk that a mask hides for the whole tile is never scored: its rows' visible keys
  // in the tile keep the score of a hidden key, -inf.
  void hide_in_weights(const Chunk& chunk, Index tile_first, Index tile_end) const {
    const Index row_end = std::min(rows_, chunk.first_row + chunk.vectors * lanes_);
    for (Index r = chunk.first_row; r < row_end; ++r) {
      const Index first = std::max<Index>(s_.first_key[r], tile_first);
      const Index end = std::min<Index>(s_.end_key[r], tile_end);
      if (first < end) std::fill(kept_row(r) + first, kept_row(r) + end, kMinusInfinity);
    }
  }

  // Row r of the weights output, written once: its kept scores made weights by its lse
  // (tile::weights_of_scores) over the keys it sees, 0 for every other key of the batch.
  void finish_weights(Index r, double lse) const {
    const MutableTensorView& weights = *p_.outputs.weights;
    float* row = row_of<float>(weights, seg_->batch, s_.head[r], s_.query_row[r]);
    const Index first = seg_->k_begin + s_.first_key[r];
    const Index end = std::max(first, seg_->k_begin + s_.end_key[r]);
    std::fill(row, row + first, 0.0f);
    tile::weights_of_scores(kept_row(r) + s_.first_key[r], end - first, weight_scale_of_lse(lse),
                            row + first);
    std::fill(row + end, row + weights.shape[3], 0.0f);
  }

  // A chunk's scores made its weights: shaped, kept for a weights output, then the online
  // softmax (P overwrites S).
  void weigh_scores(const Chunk& chunk) {
    shape_scores(chunk);
    if (keep_weights_) keep_scores(chunk);
    update_softmax(chunk);
  }

  // The shared online softmax, lanes being rows; P overwrites S, and rescale[r] =
  // exp(m_old - m_new) is left for accumulate_context.
  void update_softmax(const Chunk& chunk) {
    for (Index c = 0; c < chunk.vectors; ++c) {
      const Index row = chunk.first_row + c * lanes_;
      tile::online_softmax_rows(scores_at(chunk.first, row), chunk.end - chunk.first, rows_padded_,
                                s_.row_max.get() + row, s_.row_sum.get() + row,
                                s_.rescale.get() + row);
    }
  }

  void accumulate_context(const Chunk* chunks, Index chunk_count, bool values_finite) {
    RowBlock* blocks = s_.blocks.get();
    Index block_count = 0;
    for (Index c = 0; c < chunk_count; ++c) {
      const Chunk& chunk = chunks[c];
      const Index row_end = std::min(rows_, chunk.first_row + chunk.vectors * lanes_);
      for (Index r0 = chunk.first_row; r0 < row_end; r0 += block_rows_) {
        RowBlock block{r0, std::min(block_rows_, row_end - r0), chunk.end, chunk.first, false};
        for (Index r = r0; r < r0 + block.rows; ++r) {
          const Index first = std::max<Index>(s_.first_key[r], chunk.first);
          const Index end = std::min<Index>(s_.end_key[r], chunk.end);
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
    const Index row_end = std::min(rows_, chunk.first_row + chunk.vectors * lanes_);
    const auto range = [&](Index r) {
      return std::pair<Index, Index>{std::max<Index>(s_.first_key[r], chunk.first),
                                     std::min<Index>(s_.end_key[r], chunk.end)};
    };
    for (Index r0 = chunk.first_row; r0 < row_end; r0 += 4) {
      const Index rows = std::min<Index>(4, row_end - r0);
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
    alignas(64) float weights[NR][Traits::kKeyTile];  // P of the tile's keys, by row
    float* acc[NR];
    const float* p[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = s_.context.get() + (r0 + r) * dim_v_padded_;
      p[r] = weights[r];
      const float rescale = s_.rescale[r0 + r];
      if (rescale != 1.0f) tile::rescale_row(acc[r], dim_v_, rescale);
      for (Index j = keys.first; j < keys.second; ++j) {
        weights[r][j - tile_first_] = *scores_at(j, r0 + r);
      }
    }
    tile::context_by_rows<T, NR>(acc, p, values, keys.first - tile_first_,
                                 keys.second - tile_first_, dim_v_);
  }

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
    const float* v = values_ + (block.first - tile_first_) * value_stride_ + column;
    const float* rescale = s_.rescale.get() + block.first_row;
    float* o = s_.context.get() + block.first_row * dim_v_padded_ + column;
    const Index keys = block.end - block.first;
    const Index r = rows_padded_, vs = value_stride_, os = dim_v_padded_;
    if (width == 1)
      return tile::context_rows_vectorised<1, kRows>(p, r, 1, v, vs, keys, rescale, o, os);
    if (width == 2)
      return tile::context_rows_vectorised<2, kRows>(p, r, 1, v, vs, keys, rescale, o, os);
    tile::context_rows_vectorised<3, kRows>(p, r, 1, v, vs, keys, rescale, o, os);
  }

  void context_skipping_hidden(const RowBlock& block) {
    for (Index r = block.first_row; r < block.first_row + block.rows; ++r) {
      tile::context_skipping_zero_weights(scores_at(block.first, r), rows_padded_,
                                          values_ + (block.first - tile_first_) * value_stride_,
                                          value_stride_, block.end - block.first, s_.rescale[r],
                                          s_.context.get() + r * dim_v_padded_, dim_v_padded_);
    }
  }

  // context = O / l and lse = m + log(l), by the end-of-row rule of the tile core; kept
  // scores become weights.
  void finish() const {
    for (Index r = 0; r < rows_; ++r) {
      const RowEnd<float> end = end_of_row(s_.row_max[r], s_.row_sum[r]);
      if (keep_weights_) finish_weights(r, end.lse);
      // O's row, or O^T's column with an AMX context
      const float* o = s_.context.get() + (amx_context_ ? r : r * dim_v_padded_);
      const Index step = amx_context_ ? rows_padded_ : 1;
      with_float_type(p_.outputs.context.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* row = row_of<T>(p_.outputs.context, seg_->batch, s_.head[r], s_.query_row[r]);
        for (Index d = 0; d < dim_v_; ++d) row[d] = from_float<T>(o[d * step] * end.inverse_l);
      });
      if (p_.outputs.lse) {
        const MutableTensorView& lse = *p_.outputs.lse;
        const Index b = seg_->batch, h = s_.head[r], i = s_.query_row[r];
        if (lse.dtype == DType::f64) {
          *row_of<double>(lse, b, h, i) = end.lse;
        } else {
          *row_of<float>(lse, b, h, i) = static_cast<float>(end.lse);
        }
      }
    }
  }

  const Problem& p_;
  Scratch& s_;
  const tile::ScoreShaping shaping_{p_.softcap, !p_.alibi_slopes.empty()};
  const Index lanes_ = tile::lanes();
  // Context blocks never straddle two row chunks: 4 rows, or 1 on the 1-lane target.
  const Index block_rows_ = lanes_ >= Traits::kContextRows ? Traits::kContextRows : 1;
  const Index dim_ = kDim > 0 ? kDim : p_.dim_qk;
  const Index dim_v_ = kDim > 0 ? kDim : p_.dim_v;
  const Index dim_v_padded_ = round_up(dim_v_, lanes_);
  // Scores of bf16 q and k by bf16 dot products (cpu/bf16_dot.hpp) where the CPU has them:
  // an even head dim, and 16 rows per vector (the AVX-512 targets).
  const bool bf16_dot_ = scores_by_bf16_dot(p_, tile::kAvx512Target);
  // fp16 q and k on AMX tiles as exact bf16 parts (cpu/amx/fp16_parts.hpp).
  const bool fp16_parts_ = scores_by_fp16_parts(p_, tile::kAvx512Target);
  // Either: q goes in as pairs, and wide chunks' scores take no float keys.
  const bool paired_scores_ = bf16_dot_ || fp16_parts_;
  const bool keep_weights_ = keeps_weights(p_);
  // Narrow tiles read K and V in place (attend_narrow_tile): 16-bit K and V of one dtype,
  // no mask (a masked key's value row would be read with weight 0).
  const bool narrow_in_place_ = p_.mask_kind == MaskKind::none && p_.k.dtype == p_.v.dtype &&
                                (p_.k.dtype == DType::f16 || p_.k.dtype == DType::bf16);
  // V^T for the context on AMX tiles where uses_amx_context, else null; amx_context_: this
  // item's context is on tiles (and kept transposed)
  const PackedValues* packed_;
  bool amx_context_ = false;
  const KeyParts* key_parts_;  // fp16 K's parts where fp16_parts_, else empty
  const Segment* seg_ = nullptr;
  Index kv_head_ = 0, rows_ = 0, rows_padded_ = 0, tile_first_ = 0, slot_ = 0;
  const float* keys_ = nullptr;
  const float* values_ = nullptr;
  Index key_stride_ = 0, value_stride_ = 0;
};

template <int kDim>
void run_kernel(const Problem& p, int threads) {
  using Traits = ForwardTraits<kDim>;
  static_assert(Traits::kRowVectorsPerItem == ForwardTraits<0>::kRowVectorsPerItem &&
                    Traits::kScoreRowVectors == ForwardTraits<0>::kScoreRowVectors,
                "forward_scores_by_dot assumes the same rows per item and chunk for every dim");
  const Index lanes = tile::lanes();
  const Index group = p.group_size();
  const Index positions =
      positions_per_item(group, lanes, forward_widens_tiles(p.k.dtype, p.v.dtype));
  std::vector<WorkItem> items;
  for (std::size_t s = 0; s < p.segments.size(); ++s) {
    const Index len_q = p.segments[s].len_q;
    for (Index kv_head = 0; kv_head < p.heads_kv; ++kv_head) {
      for (Index i = 0; i < len_q; i += positions) {
        items.push_back({static_cast<Index>(s), kv_head, i, std::min(positions, len_q - i)});
      }
    }
  }
  if (items.empty()) return;
  threads = tile::threads_for(static_cast<Index>(items.size()), threads);
  const Index rows = round_up(positions * group, lanes);
  const Index dim_v_padded = round_up(p.dim_v, lanes);
  // Kept scores take an item's real rows by its segment's keys: no more than the item's
  // share of the weights output.
  Index kept_rows = 0, kept_keys = 0;
  if (keeps_weights(p)) {
    for (const Segment& segment : p.segments) {
      kept_rows = std::max(kept_rows, std::min(positions, segment.len_q) * group);
      kept_keys = std::max(kept_keys, segment.len_k);
    }
  }
  std::optional<PackedValues> packed;
  if (uses_amx_context(p)) packed = pack_values(p, threads);
  const KeyParts key_parts(p, threads);
  // A chunk's weight parts over its key blocks: a tile's keys and a block on either side.
  const Index weight_part_words = packed ? kWeightParts * (Traits::kKeyTile + 2 * kAmxKeyBlock) /
                                               2 * (Traits::kScoreRowVectors * lanes)
                                         : 0;
  const bool fp16_parts = scores_by_fp16_parts(p, tile::kAvx512Target);
  std::vector<Scratch> scratch;
  scratch.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    scratch.emplace_back(rows, p.dim_qk, dim_v_padded, Traits::kKeyTile, Traits::kScoreKeys,
                         kept_rows, kept_keys, weight_part_words, fp16_parts);
  }
  const PackedValues* values_t = packed ? &*packed : nullptr;
  tile::run_items(static_cast<Index>(items.size()), threads, [&](int thread) {
    return [&, kernel = ItemKernel<kDim>(p, scratch[static_cast<std::size_t>(thread)], values_t,
                                         key_parts)](Index i) mutable {
      kernel.run(items[static_cast<std::size_t>(i)]);
    };
  });
}

}  // namespace

void ForwardTarget(const Problem& problem, int threads) {
  with_head_dim(problem.dim_qk, problem.dim_v,
                [&](auto dim) { run_kernel<decltype(dim)::value>(problem, threads); });
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(ForwardTarget);

void forward(const core::Problem& problem) {
  HWY_DYNAMIC_DISPATCH(ForwardTarget)(problem, resolve_threads(problem.threads));
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
