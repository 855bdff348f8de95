// The paged kernel (flash-decoding over pages: attn's own KVCache or a caller's pools). The
// keys of each sequence are cut into parts: a shared prompt prefix (pages that every
// sequence of a fork group holds, read once for all their queries), then the sequence's own
// keys, each cut at multiples of DecodeTraits::kSplitKeys; a long query run is cut into
// runs of kSplitQueries. A part is computed over every KV head; its rows are every query head
// for each query of each member, so each K/V row is loaded once per part. A task is one part,
// or every part of a long query run in key order (DecodeParts' merged tasks). Within a part,
// keys go by tiles of one page (or a few small pages), every KV head of a tile in turn,
// which is the order of the pages' memory. Per tile and KV head, with the pieces of
// cpu/tile/: scores for blocks of the head's rows by the dot micro-kernel (K converted to
// float32 in registers, or bf16 pairs by vdpbf16ps: Bf16Products), then per softmax step of
// kSoftmaxKeys keys the shared shaper and online softmax per row and P V into the row's
// accumulator. Each part leaves one state per row; the states of a row's parts are merged in key
// order by the shared state merge (a merged task's as it goes, the rest afterwards), so threads
// only change who computes a part, never what is merged in which order. Every kernel here computes
// a row alone (the NR-row kernels give each row the bits of the one-row kernel), which with the
// fixed cuts of DecodeTraits makes a row's bits its own. Keys outside a row's causal/window range
// are not read for that row (scores set to -inf, value rows skipped), so NaN in them never reaches
// the output.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/decode/decode.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "attn/error.hpp"
#include "core/element_type.hpp"
#include "core/rotary.hpp"
#include "core/visible_keys.hpp"
#include "cpu/bf16_dot.hpp"
#include "cpu/decode/decode.hpp"
#include "cpu/decode/parts.hpp"
#include "cpu/decode/traits.hpp"
#include "cpu/threads.hpp"

#include "cpu/tile/bf16_pairs-inl.h"
#include "cpu/tile/context_kernels-inl.h"
#include "cpu/tile/run-inl.h"
#include "cpu/tile/score_kernels-inl.h"
#include "cpu/tile/shaping-inl.h"
#include "cpu/tile/softmax-inl.h"
#include "cpu/tile/stored_rows-inl.h"
#include "cpu/tile/target-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using tile::DF;
using tile::DI;
using tile::kMinusInfinity;
using tile::kToL1;
using tile::kToL2;
using tile::prefetch_row;
using tile::VF;
using Traits = DecodeTraits;

// Whether the next tile's keys are asked to L1 as well as two tiles ahead to L2: on AVX-512
// (Zen 4) that made Hq = 8 8% faster from memory; on AVX2 (Zen 3) Hq = 8 the same and
// Hq = 32 4% slower, so the 16-register x86 targets ask only for L2.
constexpr bool kNextKeysToL1 = !(HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3);

// Per-thread scratch, sized for the largest part (tile::scratch_buffer).
struct Scratch {
  Scratch(Index rows, Index dim, Index dim_v, bool bf16_queries, bool merged_bf16_context)
      : queries(tile::scratch_buffer<float>(rows * dim)),
        scores(tile::scratch_buffer<float>(rows * Traits::kKeyTile)),
        acc(tile::scratch_buffer<float>(rows * dim_v)),
        row_max(tile::scratch_buffer<float>(rows)),
        row_sum(tile::scratch_buffer<float>(rows)),
        slope(tile::scratch_buffer<float>(rows)),
        query_sum(tile::scratch_buffer<float>(rows)),
        first_key(tile::scratch_buffer<Index>(rows)),
        end_key(tile::scratch_buffer<Index>(rows)),
        position(tile::scratch_buffer<Index>(rows)),
        key_floats(tile::scratch_buffer<float>(Traits::kKeyTile * dim)),
        value_floats(tile::scratch_buffer<float>(Traits::kKeyTile * dim_v)),
        rotated(tile::scratch_buffer<double>(dim)),
        rotated_floats(tile::scratch_buffer<float>(dim)),
        query_bf16(
            tile::scratch_buffer<bfloat16>(bf16_queries ? rows * tile::bf16_padded_dim(dim) : 0)),
        packed_keys(tile::scratch_buffer<std::uint32_t>(
            bf16_queries ? Traits::kKeyTile / tile::kPackedKeys * tile::packed_key_words(dim) : 0)),
        natural_acc(tile::scratch_buffer<float>(merged_bf16_context ? rows * dim_v : 0)) {}

  hwy::AlignedFreeUniquePtr<float[]> queries;  // [rows][dim]: scale * q
  hwy::AlignedFreeUniquePtr<float[]> scores;   // [rows][kKeyTile]: scores, then weights
  hwy::AlignedFreeUniquePtr<float[]> acc;      // [rows][dim_v]: unnormalised context
  hwy::AlignedFreeUniquePtr<float[]> row_max, row_sum, slope;       // [rows]
  hwy::AlignedFreeUniquePtr<float[]> query_sum;                     // [rows]: sum of queries[r]
  hwy::AlignedFreeUniquePtr<Index[]> first_key, end_key, position;  // [rows]
  // [kKeyTile][dim], [kKeyTile][dim_v]: a tile's keys and values widened, for many rows.
  hwy::AlignedFreeUniquePtr<float[]> key_floats, value_floats;
  const float* key_rows[Traits::kKeyTile];
  const float* value_rows[Traits::kKeyTile];
  hwy::AlignedFreeUniquePtr<double[]> rotated;        // [dim]: a query row being rotated
  hwy::AlignedFreeUniquePtr<float[]> rotated_floats;  // [dim]: it rounded to float32
  // [rows][tile::bf16_padded_dim]: q as given, zero past dim (bf16 scores).
  hwy::AlignedFreeUniquePtr<bfloat16[]> query_bf16;
  // A tile's keys laid by tile::pack_key_pairs, for a prefill run's bf16 scores.
  hwy::AlignedFreeUniquePtr<std::uint32_t[]> packed_keys;
  // [rows][dim_v]: acc in value-dim order, for a merged task's part with bf16 P V.
  hwy::AlignedFreeUniquePtr<float[]> natural_acc;
};

// Which products run on AVX512-BF16's vdpbf16ps (cpu/tile/bf16_pairs-inl.h): a bf16 cache
// on an AVX-512 target of a CPU where it pays (bf16_dot_pays), the scores where q is bf16 as given
// (rotary rounds rotated rows to float32) and a KV head serves several query heads, P V where P is
// rounded (pv_precision bf16) and dim_v a multiple of 32. One query head per KV head is
// bound by memory, where the bf16 scores measured 5-10% slower (bench/README.md). Chosen per
// call, never by row count, so that a row's bits stay its own.
struct Bf16Products {
  bool scores = false, context = false;
};

template <class T>
Bf16Products bf16_products(const DecodeProblem& p) {
  if (!ATTN_TILE_BF16_DOT || !std::is_same_v<T, bfloat16> || !bf16_dot_pays()) return {};
  return {p.q_dtype == DType::bf16 && p.rotary == nullptr && p.group_size() > 1,
          p.pv_precision == PvPrecision::bf16 && p.dim_v % 32 == 0 &&
              p.values.dtype == CacheDType::bf16};
}

// tile::GroupedRow's shift to the scale of an element: log2 of the group, or with one
// scale a row (group 0) past any element.
Index scale_shift(Index group) {
  return group > 0 ? std::countr_zero(static_cast<std::uint64_t>(group)) : 62;
}

// Value rows of dtype V, of a pool whose dtype is not the keys', widened to float32 by the
// kernels' own reads, each element times its scale (plus its offset: zero points): rows[t]
// and scales[t] are row t's bytes and scales (int8, int4: the row's; fp8: its KV head's, or
// null). So one kernel per key dtype serves every value dtype, at the cost of a widening per
// tile.
template <class V>
void widen_values(const cache::PageRows& values, const std::byte* const* rows,
                  const float* const* scales, Index count, float* out, const float** out_rows) {
  const Index dim = values.dim, shift = scale_shift(values.group);
  for (Index t = 0; t < count; ++t) {
    const auto* codes = reinterpret_cast<const V*>(rows[t]);
    float* row = out + t * dim;
    if (scales[t] == nullptr) {
      if constexpr (!std::is_same_v<V, Int4Pair>) tile::widen_row(codes, dim, row);
    } else if (values.zero_point) {
      tile::widen_row(tile::GroupedRow<V, true>{codes, scales[t], shift}, dim, row);
    } else {
      tile::widen_row(tile::GroupedRow<V>{codes, scales[t], shift}, dim, row);
    }
    out_rows[t] = row;
  }
}

// Calls f with std::type_identity<T>, T the element type a pool of dtype holds, so each
// choice of a template by CacheDType is written once.
template <class F>
auto with_stored_type(CacheDType dtype, F&& f) {
  switch (dtype) {
    case CacheDType::f32:
      return f(std::type_identity<float>{});
    case CacheDType::f16:
      return f(std::type_identity<float16>{});
    case CacheDType::bf16:
      return f(std::type_identity<bfloat16>{});
    case CacheDType::int8:
      return f(std::type_identity<std::int8_t>{});
    case CacheDType::fp8_e4m3:
      return f(std::type_identity<float8_e4m3>{});
    case CacheDType::fp8_e5m2:
      return f(std::type_identity<float8_e5m2>{});
    case CacheDType::int4:
      return f(std::type_identity<Int4Pair>{});
  }
  throw Error("dtype: not a cache dtype");
}

using WidenValues = void (*)(const cache::PageRows&, const std::byte* const*, const float* const*,
                             Index, float*, const float**);

WidenValues widen_values_of(CacheDType dtype) {
  return with_stored_type(dtype, [](auto stored) -> WidenValues {
    return widen_values<typename decltype(stored)::type>;
  });
}

// Where the keys [t0, t1) of one KV head lie: a row pointer and a scale per key (int8's per
// token, fp8's per KV head; and an offset, int8's with zero points), or for rows read with
// their group scales (grouped int8, int4) the rows with them, with their offsets too where
// the codes have zero points. Values of another dtype than the keys' (widened per tile) are
// their bytes and their scales instead.
template <class T>
struct TileRows {
  Index kv_head = 0, t0 = 0, t1 = 0;
  const T* keys[Traits::kKeyTile];
  const T* values[Traits::kKeyTile];
  const std::byte* value_bytes[Traits::kKeyTile];
  const float* value_scales[Traits::kKeyTile];
  float key_scale[Traits::kKeyTile], value_scale[Traits::kKeyTile];
  float key_offset[Traits::kKeyTile], value_offset[Traits::kKeyTile];
  tile::GroupedRow<T> grouped_keys[Traits::kKeyTile];
  tile::GroupedRow<T> grouped_values[Traits::kKeyTile];
  tile::GroupedRow<T, true> zero_point_keys[Traits::kKeyTile];
  tile::GroupedRow<T, true> zero_point_values[Traits::kKeyTile];

  Index count() const { return t1 - t0; }
};

// Merges a part's states (m, l and acc in value-dim order, its rows of every KV head as the
// part lays them) into the state rows of its members' queries.
void merge_part(const DecodeProblem& p, const Part& part, const float* pm, const float* pl,
                const float* pacc, State& state) {
  const Index group = p.group_size(), dim_v = p.dim_v;
  float *m = state.m.data_as<float>(), *l = state.l.data_as<float>();
  float* acc = state.acc.data_as<float>();
  for (const Member& member : part.members) {
    const Index n_q = member.query_end - member.query_begin;
    for (Index head = 0; head < p.heads_q; ++head) {
      const Index first_row = head / group * part.rows + member.row_offset + head % group * n_q;
      for (Index i = 0; i < n_q; ++i) {
        const Index out = p.state_rows.at(member.seq, head, member.query_begin + i);
        const Index in = first_row + i;
        merge_state(m[out], l[out], acc + out * dim_v, pm[in], pl[in], pacc + in * dim_v, dim_v);
      }
    }
  }
}

template <class T>
class TaskKernel {
 public:
  TaskKernel(const DecodeProblem& p, const DecodeParts& plan, Scratch& s, State& partial,
             State& state)
      : p_(p), plan_(plan), s_(s), partial_(partial), state_(state) {}

  // The task's parts in key order, each part's states merged into the step's state as soon as
  // it is computed (a merged task) or left in its partial rows.
  void run(const Task& task) {
    for (Index i = task.first; i < task.end; ++i) {
      compute(i);
      put_states(i, task.merged);
    }
  }

 private:
  void compute(Index part_index) {
    const Part& part = plan_.parts[static_cast<std::size_t>(part_index)];
    const Index group = p_.group_size(), rows = part.rows;
    Index union_first = part.key_end, union_end = part.key_begin;
    for (Index kv_head = 0; kv_head < p_.heads_kv; ++kv_head) {
      for (const Member& m : part.members) {
        const Index n_q = m.query_end - m.query_begin;
        for (Index local = 0; local < group * n_q; ++local) {
          const Index r = kv_head * rows + m.row_offset + local;
          const Index head = kv_head * group + local / n_q, i = m.query_begin + local % n_q;
          prepare_row(r, m.seq, head, i, part);
          union_first = std::min(union_first, s_.first_key[r]);
          union_end = std::max(union_end, s_.end_key[r]);
        }
      }
    }
    // Memory order: a block holds every KV head's rows one after another, so walking heads
    // inside a tile of one block reads the pools front to back, where the hardware
    // prefetchers keep up; head by head over many blocks jumps every few KiB and reads at
    // less than half the bandwidth. The rows of each tile are found tiles_ahead_ tiles
    // ahead, so that the tile being computed can ask for the next tile's rows and that far
    // one's (see Lookahead). Tiles start at multiples of the step, whatever the rows' first
    // key, so that softmax steps do too.
    const Index step = tile_keys(p_.page_size());
    const auto tile_end = [&](Index t0) { return std::min(union_end, (t0 / step + 1) * step); };
    const auto& table = p_.tables[static_cast<std::size_t>(part.members[0].seq)];
    // The tile after `from`: the next KV head of its keys, or the first head of the next
    // keys; empty after the last.
    const auto follow = [&](const TileRows<T>& from, TileRows<T>& to) {
      const Index kv_head = (from.kv_head + 1) % p_.heads_kv;
      const Index t0 = kv_head == 0 ? from.t1 : from.t0;
      to.t0 = to.t1 = t0;
      if (from.count() > 0 && t0 < union_end) find_rows(table, kv_head, t0, tile_end(t0), to);
    };
    // Tile i is at tiles[i % ring].
    std::array<TileRows<T>,
               std::max(Traits::kTilesAheadHeadMajor, Traits::kTilesAheadTokenMajor) + 1>
        tiles;
    const std::size_t ahead = tiles_ahead_, ring = ahead + 1;
    if (union_first < union_end) {
      const Index t0 = union_first / step * step;
      find_rows(table, 0, t0, tile_end(t0), tiles[0]);
    }
    for (std::size_t i = 1; i < ahead; ++i) follow(tiles[i - 1], tiles[i]);
    for (std::size_t i = 0; tiles[i].count() > 0; i = (i + 1) % ring) {
      TileRows<T>& far = tiles[(i + ahead) % ring];
      follow(tiles[(i + ahead - 1) % ring], far);
      tile(tiles[i], {tiles[(i + 1) % ring], far}, tiles[i].kv_head * rows,
           (tiles[i].kv_head + 1) * rows);
    }
  }

  // The computed part's states: merged into the step's state now, or copied to its partial
  // rows; acc in value-dim order either way.
  void put_states(Index part_index, bool merged) {
    const Part& part = plan_.parts[static_cast<std::size_t>(part_index)];
    const Index all_rows = p_.heads_kv * part.rows;
    const Index offset = plan_.state_offset[static_cast<std::size_t>(part_index)];
    float* acc = merged ? s_.natural_acc.get() : partial_.acc.data_as<float>() + offset * p_.dim_v;
    if (bf16_.context) {
      for (Index r = 0; r < all_rows; ++r)
        for (Index d = 0; d < p_.dim_v; ++d)
          acc[r * p_.dim_v + d] = s_.acc[r * p_.dim_v + tile::paired_position(d)];
    }
    if (merged) {
      return merge_part(p_, part, s_.row_max.get(), s_.row_sum.get(),
                        bf16_.context ? acc : s_.acc.get(), state_);
    }
    std::copy_n(s_.row_max.get(), all_rows, partial_.m.data_as<float>() + offset);
    std::copy_n(s_.row_sum.get(), all_rows, partial_.l.data_as<float>() + offset);
    if (!bf16_.context) std::copy_n(s_.acc.get(), all_rows * p_.dim_v, acc);
  }

  void prepare_row(Index r, Index seq, Index head, Index i, const Part& part) {
    const Index length = p_.lengths[static_cast<std::size_t>(seq)];
    const Index position = p_.query_position(seq, i);
    const core::KeyRange keys = p_.rule.visible_keys(position, length);
    s_.first_key[r] = std::max(keys.first, part.key_begin);
    s_.end_key[r] = std::min(keys.end, part.key_end);
    s_.position[r] = position;
    s_.slope[r] =
        p_.rule.alibi_slopes.empty() ? 0.0f : p_.rule.alibi_slopes[static_cast<std::size_t>(head)];
    s_.row_max[r] = kMinusInfinity;
    s_.row_sum[r] = 0.0f;
    std::fill_n(s_.acc.get() + r * p_.dim_v, p_.dim_v, 0.0f);
    // float64 q (the paged kernel has no reference to fall back on) is rounded to float32.
    core::with_float_type(p_.q_dtype, [&](auto tag) {
      using Q = decltype(tag);
      const Q* q = static_cast<const Q*>(p_.q) + p_.q_rows.at(seq, head, i);
      const auto scale = static_cast<float>(p_.rule.scale);
      if constexpr (std::is_same_v<Q, bfloat16>) {
        if (bf16_.scores) {
          bfloat16* row = s_.query_bf16.get() + r * tile::bf16_padded_dim(p_.dim);
          std::fill(std::copy_n(q, p_.dim, row), row + tile::bf16_padded_dim(p_.dim), bfloat16{});
          return;
        }
      }
      if (p_.rotary == nullptr) {
        tile::scaled_query(q, p_.dim, scale, s_.queries.get() + r * p_.dim);
      } else {
        // Rotated in float64, rounded once to float32, then scaled as an unrotated row.
        for (Index d = 0; d < p_.dim; ++d) s_.rotated[d] = core::to_double(q[d]);
        core::rotate(*p_.rotary, p_.dim, p_.rotary_position(seq, i), s_.rotated.get());
        for (Index d = 0; d < p_.dim; ++d) {
          s_.rotated_floats[d] = static_cast<float>(s_.rotated[d]);
        }
        tile::scaled_query(s_.rotated_floats.get(), p_.dim, scale, s_.queries.get() + r * p_.dim);
      }
      if (row_offsets_) {
        // In order, in float32: q . (c s + o) = s (q . c) + o sum(q) for zero-point rows.
        float sum = 0.0f;
        for (Index d = 0; d < p_.dim; ++d) sum += s_.queries[r * p_.dim + d];
        s_.query_sum[r] = sum;
      }
    });
  }

  // Asks for the tile's value rows to come to L1 while its keys are scored: they are read
  // after the softmax, a few columns of every row at a time, where the hardware prefetchers
  // lag. This made Hq = 32, Hkv = 8 decode 5-10% faster from memory.
  HWY_INLINE void prefetch_values_to_l1(const TileRows<T>& rows, Index count) const {
    for (Index t = 0; t < count; ++t) prefetch_row<kToL1>(value_row(rows, t), value_row_bytes_);
  }

  // Where value row t of the tile lies.
  HWY_INLINE const void* value_row(const TileRows<T>& rows, Index t) const {
    if (widen_values_) return rows.value_bytes[t];
    return rows.values[t];
  }

  // Finds the rows of keys [t0, t1) of kv_head through the page table.
  void find_rows(std::span<const std::int32_t> table, Index kv_head, Index t0, Index t1,
                 TileRows<T>& rows) const {
    if (widen_values_) return find_rows_of<true>(table, kv_head, t0, t1, rows);
    find_rows_of<false>(table, kv_head, t0, t1, rows);
  }

  // find_rows, for values of the keys' dtype or (kWidenValues) of another one.
  template <bool kWidenValues>
  void find_rows_of(std::span<const std::int32_t> table, Index kv_head, Index t0, Index t1,
                    TileRows<T>& rows) const {
    const cache::PageRows &keys = p_.keys, &values = p_.values;
    const Index page = p_.page_size();
    rows.kv_head = kv_head;
    rows.t0 = t0;
    rows.t1 = t1;
    for (Index t = t0; t < t1;) {
      const std::int32_t block = table[static_cast<std::size_t>(t / page)];
      const std::byte* k = keys.rows(block, kv_head);
      const std::byte* v = values.rows(block, kv_head);
      const float* k_scales = kScaled ? keys.scale_row(block, kv_head) : nullptr;
      const float* v_scales = (kWidenValues ? widened_value_scales_ : kScaled)
                                  ? values.scale_row(block, kv_head)
                                  : nullptr;
      if constexpr (kFloat8) {
        if (row_scales_) {
          const float k_head = keys.head_scaled() ? *keys.scale_row(block, kv_head) : 1.0f;
          const float v_head = values.head_scaled() ? *values.scale_row(block, kv_head) : 1.0f;
          std::fill_n(rows.key_scale + (t - t0), std::min(page - t % page, t1 - t), k_head);
          std::fill_n(rows.value_scale + (t - t0), std::min(page - t % page, t1 - t), v_head);
        }
      }
      for (Index slot = t % page; slot < page && t < t1; ++slot, ++t) {
        const Index i = t - t0;
        rows.keys[i] = reinterpret_cast<const T*>(k + slot * keys.slot_bytes);
        const std::byte* value = v + slot * values.slot_bytes;
        if constexpr (kWidenValues) {
          rows.value_bytes[i] = value;
          rows.value_scales[i] =
              v_scales == nullptr ? nullptr : v_scales + slot * values.slot_scales;
        } else {
          rows.values[i] = reinterpret_cast<const T*>(value);
        }
        if constexpr (kScaled) {
          const float* key_scales = k_scales + slot * keys.slot_scales;
          // The values' own scales where they are read as the keys are.
          const float* value_scales = kWidenValues ? nullptr : v_scales + slot * values.slot_scales;
          if (zero_point_) {
            rows.zero_point_keys[i] = {rows.keys[i], key_scales, key_scale_shift_};
            if (!kWidenValues) {
              rows.zero_point_values[i] = {rows.values[i], value_scales, value_scale_shift_};
            }
          } else if (grouped_) {
            rows.grouped_keys[i] = {rows.keys[i], key_scales, key_scale_shift_};
            if (!kWidenValues) {
              rows.grouped_values[i] = {rows.values[i], value_scales, value_scale_shift_};
            }
          } else {
            rows.key_scale[i] = key_scales[0];
            if (!kWidenValues) rows.value_scale[i] = value_scales[0];
            if (row_offsets_) {
              rows.key_offset[i] = key_scales[1];
              if (!kWidenValues) rows.value_offset[i] = value_scales[1];
            }
          }
        }
      }
    }
  }

  // Tiles after the one being computed, in memory order: the next, and the far one,
  // tiles_ahead_ after the one being computed.
  struct Lookahead {
    const TileRows<T>& next;
    const TileRows<T>& far;

    Index count() const { return std::max(next.count(), far.count()); }
  };

  // Asks for rows [begin, end) of the tiles ahead: the keys and values of the far one to
  // come to L2, then (kNextKeysToL1) the keys of the next one to L1. The scoring loop asks
  // for as many rows as keys it has scored, so the requests go out spread over the tile's work.
  // Spread, in this order, this far ahead: every other choice measured on head-major pages
  // was slower from memory (bench/README.md, "Decode prefetching", has the figures).
  HWY_INLINE void prefetch_ahead(const Lookahead& ahead, Index begin, Index end) const {
    for (Index t = begin; t < std::min(end, ahead.far.count()); ++t) {
      prefetch_row<kToL2>(ahead.far.keys[t], key_row_bytes_);
      prefetch_row<kToL2>(value_row(ahead.far, t), value_row_bytes_);
    }
    if (!kNextKeysToL1) return;
    for (Index t = begin; t < std::min(end, ahead.next.count()); ++t) {
      prefetch_row<kToL1>(ahead.next.keys[t], key_row_bytes_);
    }
  }

  // The keys of `rows` against the query rows [row_begin, row_end) of their KV head, while
  // the rows of the tiles `ahead` are asked for.
  void tile(const TileRows<T>& rows, const Lookahead& ahead, Index row_begin, Index row_end) {
    const Index count = rows.count();
    prefetch_values_to_l1(rows, count);
    // Many rows (a prefill run) read each key and value once per block of rows: widened once
    // per tile (by the kernels' own reads, tile::widen_row), they are not converted again
    // for every block, and the bits are the same.
    if (!std::is_same_v<T, float> && row_end - row_begin > Traits::kWidenRows && !bf16_.scores &&
        !bf16_.context) {
      widen_tile(rows);
      return tile_of(rows, s_.key_rows, s_.value_rows, ahead, row_begin, row_end);
    }
    if (widen_values_) {
      widen_other_values_(p_.values, rows.value_bytes, rows.value_scales, count,
                          s_.value_floats.get(), s_.value_rows);
      return with_key_rows(rows, [&](const auto* keys) {
        tile_of(rows, keys, s_.value_rows, ahead, row_begin, row_end);
      });
    }
    if constexpr (kScaled) {
      if (zero_point_) {
        return tile_of(rows, rows.zero_point_keys, rows.zero_point_values, ahead, row_begin,
                       row_end);
      }
      if (grouped_) {
        return tile_of(rows, rows.grouped_keys, rows.grouped_values, ahead, row_begin, row_end);
      }
    }
    if constexpr (!kInt4) tile_of(rows, rows.keys, rows.values, ahead, row_begin, row_end);
  }

  // f(the tile's key rows as the micro-kernels read them where they lie).
  template <class F>
  void with_key_rows(const TileRows<T>& rows, const F& f) const {
    if constexpr (kScaled) {
      if (zero_point_) return f(rows.zero_point_keys);
      if (grouped_) return f(rows.grouped_keys);
    }
    if constexpr (!kInt4) f(rows.keys);
  }

  void widen_tile(const TileRows<T>& rows) {
    with_key_rows(rows, [&](const auto* keys) {
      for (Index t = 0; t < rows.count(); ++t) {
        s_.key_rows[t] = s_.key_floats.get() + t * p_.dim;
        tile::widen_row(keys[t], p_.dim, s_.key_floats.get() + t * p_.dim);
      }
    });
    if (widen_values_) {
      return widen_other_values_(p_.values, rows.value_bytes, rows.value_scales, rows.count(),
                                 s_.value_floats.get(), s_.value_rows);
    }
    const auto widen = [&](const auto* values) {
      for (Index t = 0; t < rows.count(); ++t) {
        s_.value_rows[t] = s_.value_floats.get() + t * p_.dim_v;
        tile::widen_row(values[t], p_.dim_v, s_.value_floats.get() + t * p_.dim_v);
      }
    };
    if constexpr (kScaled) {
      if (zero_point_) return widen(rows.zero_point_values);
      if (grouped_) return widen(rows.grouped_values);
    }
    if constexpr (!kInt4) widen(rows.values);
  }

  // KeyRow, ValueRow: the key and value rows as the micro-kernels take them
  // (tile::row_floats).
  template <class KeyRow, class ValueRow>
  void tile_of(const TileRows<T>& rows, const KeyRow* keys, const ValueRow* values,
               const Lookahead& ahead, Index row_begin, Index row_end) {
    const bool packed = pack_keys(keys, rows.count(), row_end - row_begin);
    for (Index r = row_begin; r < row_end; r += Traits::kRowBlock) {
      const Index block_rows = std::min<Index>(Traits::kRowBlock, row_end - r);
      score_rows(r, block_rows, keys, rows.count(), r == row_begin ? &ahead : nullptr, packed);
    }
    for (Index step = rows.t0; step < rows.t1; step += Traits::kSoftmaxKeys) {
      softmax_rows(row_begin, row_end, rows, step);
      for (Index r = row_begin; r < row_end; r += Traits::kRowBlock) {
        const Index block_rows = std::min<Index>(Traits::kRowBlock, row_end - r);
        accumulate(r, block_rows, rows.t0, values, step);
      }
    }
  }

  // Whether the tile's keys are laid for tile::scores_by_packed_keys_bf16 (done here): bf16
  // scores of more than kWidenRows rows of the KV head (a prefill run), for which laying
  // them once costs less than the shuffle trees of the dot kernel, with the same bits.
  template <class KeyRow>
  bool pack_keys([[maybe_unused]] const KeyRow* keys, [[maybe_unused]] Index count,
                 [[maybe_unused]] Index rows) {
#if ATTN_TILE_BF16_DOT
    if constexpr (std::is_same_v<KeyRow, const bfloat16*>) {
      if (bf16_.scores && rows > Traits::kWidenRows) {
        pack_keys_bf16(keys, count);
        return true;
      }
    }
#endif
    return false;
  }

  // Scores of keys [0, count) for rows [r0, r0 + block_rows); `packed`: read from the tile's
  // keys as pack_keys laid them.
  template <class Row>
  void score_rows(Index r0, Index block_rows, const Row* keys, Index count, const Lookahead* ahead,
                  [[maybe_unused]] bool packed) {
#if ATTN_TILE_BF16_DOT
    if constexpr (std::is_same_v<Row, const bfloat16*>) {
      if (bf16_.scores) return score_rows_bf16(r0, block_rows, keys, count, ahead, packed);
    }
#endif
    switch (block_rows) {
      case 4:
        return score_rows_n<4>(r0, keys, count, ahead);
      case 3:
        return score_rows_n<3>(r0, keys, count, ahead);
      case 2:
        return score_rows_n<2>(r0, keys, count, ahead);
      default:
        return score_rows_n<1>(r0, keys, count, ahead);
    }
  }

  // Scores keys [0, count) for rows [r0, r0 + NR). With `ahead`, asks for its rows as it
  // goes: as many as the keys scored so far, the rest at the end.
  template <int NR, class Row>
  void score_rows_n(Index r0, const Row* keys, Index count, const Lookahead* ahead) {
    const float* q[NR];
    for (int r = 0; r < NR; ++r) q[r] = s_.queries.get() + (r0 + r) * p_.dim;
    score_blocks<NR, tile::kDotKeys<NR>>(
        r0, keys, count, ahead, [&](const Row* block, float* const* out) ATTN_INLINE_LAMBDA {
          tile::scores_by_dot<NR>(q, block, p_.dim, out);
        });
  }

  // score_rows_n's walk over keys [0, count) of rows [r0, r0 + NR), a block of kBlockKeys
  // at a time by score(block's key rows, the rows' scores at its first key); the last keys
  // repeated to fill the last block (the tile's scores have room, since kKeyTile is a
  // multiple of the block).
  template <int NR, Index kBlockKeys, class Row, class ScoreBlock>
  HWY_INLINE void score_blocks(Index r0, const Row* keys, Index count, const Lookahead* ahead,
                               const ScoreBlock& score) {
    const auto at = [&](Index k) {
      std::array<float*, NR> scores;
      for (int r = 0; r < NR; ++r) scores[r] = s_.scores.get() + (r0 + r) * Traits::kKeyTile + k;
      return scores;
    };
    Index k = 0;
    for (; k + kBlockKeys <= count; k += kBlockKeys) {
      score(keys + k, at(k).data());
      if (ahead != nullptr) prefetch_ahead(*ahead, k, k + kBlockKeys);
    }
    if (k < count) {
      Row last[kBlockKeys];
      for (Index i = 0; i < kBlockKeys; ++i) last[i] = keys[std::min(k + i, count - 1)];
      score(last, at(k).data());
    }
    if (ahead != nullptr) prefetch_ahead(*ahead, k, ahead->count());
  }

#if ATTN_TILE_BF16_DOT
  // score_rows on AVX512-BF16 (bf16_.scores): the same blocks and requests ahead, q as
  // given, the scale after the sums.
  ATTN_BF16_TARGET void score_rows_bf16(Index r0, Index block_rows, const bfloat16* const* keys,
                                        Index count, const Lookahead* ahead, bool packed) {
    switch (block_rows) {
      case 4:
        return score_rows_bf16_n<4>(r0, keys, count, ahead, packed);
      case 3:
        return score_rows_bf16_n<3>(r0, keys, count, ahead, packed);
      case 2:
        return score_rows_bf16_n<2>(r0, keys, count, ahead, packed);
      default:
        return score_rows_bf16_n<1>(r0, keys, count, ahead, packed);
    }
  }

  ATTN_BF16_TARGET void pack_keys_bf16(const bfloat16* const* keys, Index count) {
    tile::pack_key_pairs(keys, count, p_.dim, s_.packed_keys.get());
  }

  // Scores for rows [r0, r0 + NR): by the dot kernel in blocks of keys, or (`packed`) from
  // the packed keys kPackedKeys at a time, with the same requests ahead.
  template <int NR>
  ATTN_BF16_TARGET HWY_INLINE void score_rows_bf16_n(Index r0, const bfloat16* const* keys,
                                                     Index count, const Lookahead* ahead,
                                                     bool packed) {
    const auto scale = static_cast<float>(p_.rule.scale);
    const bfloat16* q[NR];
    for (int r = 0; r < NR; ++r) {
      q[r] = s_.query_bf16.get() + (r0 + r) * tile::bf16_padded_dim(p_.dim);
    }
    if (!packed) {
      return score_blocks<NR, tile::kDotKeys<NR>>(
          r0, keys, count, ahead,
          [&](const bfloat16* const* block, float* const* out)
              ATTN_BF16_TARGET { tile::scores_by_dot_bf16<NR>(q, block, p_.dim, scale, out); });
    }
    const Index words = tile::packed_key_words(p_.dim);
    Index k = 0;
    for (; k < count; k += tile::kPackedKeys) {
      float* out[NR];
      for (int r = 0; r < NR; ++r) out[r] = s_.scores.get() + (r0 + r) * Traits::kKeyTile + k;
      tile::scores_by_packed_keys_bf16<NR>(q, s_.packed_keys.get() + k / tile::kPackedKeys * words,
                                           p_.dim, scale, out);
      if (ahead != nullptr) prefetch_ahead(*ahead, k, k + tile::kPackedKeys);
    }
    if (ahead != nullptr) prefetch_ahead(*ahead, k, ahead->count());
  }
#endif

  // Keys [first, end) of the softmax step from key `step` that row r sees.
  std::pair<Index, Index> step_keys(Index r, Index step) const {
    return {std::max(s_.first_key[r], step), std::min(s_.end_key[r], step + Traits::kSoftmaxKeys)};
  }

  // Folds the scores of the softmax step from key `step` into the state of each row of
  // [row_begin, row_end) that sees a key of it: shape_step, then the shared online softmax
  // kRowBlock rows at a time (each row's arithmetic its own, whatever rows share the block),
  // then each row's accumulator (finish_step). The weights are left in place of the scores.
  void softmax_rows(Index row_begin, Index row_end, const TileRows<T>& rows, Index step) {
    Index block[Traits::kRowBlock];
    int count = 0;
    for (Index r = row_begin; r < row_end; ++r) {
      if (!shape_step(r, rows, step)) continue;
      block[count++] = r;
      if (count == Traits::kRowBlock) {
        fold_step<Traits::kRowBlock>(block, rows, step);
        count = 0;
      }
    }
    for (int i = 0; i < count; ++i) fold_step<1>(block + i, rows, step);
  }

  // Shapes row r's scores of the softmax step's keys (the shared shaper: int8 or fp8 key
  // scale, softcap, ALiBi, hiding); false where the row sees none of them. A step is always
  // kSoftmaxKeys wide, keys past the row's range (or the tile) hidden, so its arithmetic is
  // the same whatever tile it lies in.
  bool shape_step(Index r, const TileRows<T>& rows, Index step) {
    const Index offset = step - rows.t0;
    float* s = s_.scores.get() + r * Traits::kKeyTile + offset;
    const auto [first, end] = step_keys(r, step);
    if (first >= end) return false;
    const Index vectors = Traits::kSoftmaxKeys / tile::lanes();
    const bool hide = first > step || end < step + Traits::kSoftmaxKeys;
    if (!row_scales_ && !shaping_.softcap && !shaping_.alibi && !hide) return true;
    const float* key_scale = rows.key_scale + offset;
    const float* key_offset = rows.key_offset + offset;
    if (row_offsets_ && hide) {
      shape_row<kInt8, true, kInt8>(r, s, step, first, end, key_scale, key_offset, vectors);
    } else if (row_offsets_) {
      shape_row<kInt8, false, kInt8>(r, s, step, first, end, key_scale, key_offset, vectors);
    } else if (row_scales_ && hide) {
      shape_row<kRowScaled, true>(r, s, step, first, end, key_scale, key_offset, vectors);
    } else if (row_scales_) {
      shape_row<kRowScaled, false>(r, s, step, first, end, key_scale, key_offset, vectors);
    } else if (hide) {
      shape_row<false, true>(r, s, step, first, end, key_scale, key_offset, vectors);
    } else {
      shape_row<false, false>(r, s, step, first, end, key_scale, key_offset, vectors);
    }
    return true;
  }

  // The shared online softmax of the step for the NR rows at r (each shaped, each seeing a
  // key of it), then each row's accumulator.
  template <int NR>
  void fold_step(const Index* r, const TileRows<T>& rows, Index step) {
    const Index offset = step - rows.t0;
    float* scores[NR];
    float* max[NR];
    float* sum[NR];
    for (int i = 0; i < NR; ++i) {
      scores[i] = s_.scores.get() + r[i] * Traits::kKeyTile + offset;
      max[i] = &s_.row_max[r[i]];
      sum[i] = &s_.row_sum[r[i]];
    }
    tile::RowUpdate update[NR];
    tile::online_softmax_keys<true, NR>(scores, Traits::kSoftmaxKeys / tile::lanes(), max, sum,
                                        update);
    for (int i = 0; i < NR; ++i) finish_step(r[i], update[i], rows, step);
  }

  // Row r's accumulator after its online softmax of the step: rescaled to the new max, and
  // for scaled values the weights times each value's scale (and its offset's share added).
  void finish_step(Index r, tile::RowUpdate update, const TileRows<T>& rows, Index step) {
    if (update.tile_max == kMinusInfinity) {
      // Every visible key scored -inf: no weight, no value read.
      s_.first_key[r] = std::max(s_.first_key[r], step + Traits::kSoftmaxKeys);
      return;
    }
    if (update.rescale != 1.0f)
      tile::rescale_row(s_.acc.get() + r * p_.dim_v, p_.dim_v, update.rescale);
    if (value_scales_) {
      // Zero-point values: sum_t p_t (c_t s_t + o_t) = sum_t (p_t s_t) c_t + sum_t p_t o_t,
      // the second a number added to every element of the row's context.
      float* s = s_.scores.get() + r * Traits::kKeyTile + (step - rows.t0);
      const auto [first, end] = step_keys(r, step);
      float offsets = 0.0f;
      for (Index t = first; t < end; ++t) {
        if (value_offsets_) {
          offsets = std::fma(s[t - step], rows.value_offset[t - rows.t0], offsets);
        }
        s[t - step] *= rows.value_scale[t - rows.t0];
      }
      if (offsets != 0.0f) {
        float* acc = s_.acc.get() + r * p_.dim_v;
        for (Index d = 0; d < p_.dim_v; ++d) acc[d] += offsets;
      }
    }
  }

  // The shared shaper over row r's scores of the tile [t0, t0 + vectors * lanes), lanes
  // being keys; each times its key_scale when kScale, plus its key_offset times the row's
  // query sum when kOffset; keys outside [first, end) become -inf when kHide.
  template <bool kScale, bool kHide, bool kOffset = false>
  void shape_row(Index r, float* s, Index t0, Index first, Index end, const float* key_scale,
                 const float* key_offset, Index vectors) const {
    const DF df;
    const DI di;
    const Index lanes = tile::lanes();
    const auto first_key = hn::Set(di, static_cast<std::int32_t>(first));
    const auto end_key = hn::Set(di, static_cast<std::int32_t>(end));
    const auto position = hn::Set(di, static_cast<std::int32_t>(s_.position[r]));
    const VF slope = hn::Set(df, s_.slope[r]);
    const VF query_sum = hn::Set(df, kOffset ? s_.query_sum[r] : 0.0f);
    for (Index v = 0; v < vectors; ++v) {
      const Index t = t0 + v * lanes;
      const auto key = hn::Add(hn::Iota(di, 0), hn::Set(di, static_cast<std::int32_t>(t)));
      const VF scale = kScale ? hn::LoadU(df, key_scale + v * lanes) : hn::Set(df, 1.0f);
      const VF offset =
          kOffset ? hn::Mul(hn::LoadU(df, key_offset + v * lanes), query_sum) : hn::Zero(df);
      hn::Store(tile::shape_scores<kScale, kHide, kOffset>(shaping_, hn::Load(df, s + v * lanes),
                                                           scale, offset, key, position, slope,
                                                           hn::Zero(di), first_key, end_key),
                df, s + v * lanes);
    }
  }

  // Rows whose visible keys in the softmax step are the same range go together; a row at
  // the edge of a causal or window range goes alone, so it never reads a value row it may
  // not see.
  template <class Row>
  void accumulate(Index r0, Index block_rows, Index t0, const Row* values, Index step) {
    const auto range = [&](Index r) {
      const auto [first, end] = step_keys(r, step);
      return std::pair{first - t0, end - t0};
    };
    bool same = true;
    for (Index r = r0 + 1; r < r0 + block_rows; ++r) same = same && range(r) == range(r0);
    const Index origin = step - t0;
    if (same && block_rows == 4) return accumulate_n<4>(r0, values, origin, range(r0));
    if (same && block_rows == 2) return accumulate_n<2>(r0, values, origin, range(r0));
    for (Index r = r0; r < r0 + block_rows; ++r) accumulate_n<1>(r, values, origin, range(r));
  }

  // P V of NR rows over the keys [first, end) of the softmax step from key `origin` (all
  // relative to the tile).
  template <int NR, class Row>
  void accumulate_n(Index r0, const Row* values, [[maybe_unused]] Index origin,
                    std::pair<Index, Index> keys) {
    if (keys.first >= keys.second) return;
    float* acc[NR];
    const float* p[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = s_.acc.get() + (r0 + r) * p_.dim_v;
      p[r] = s_.scores.get() + (r0 + r) * Traits::kKeyTile;
    }
#if ATTN_TILE_BF16_DOT
    if constexpr (std::is_same_v<Row, const bfloat16*>) {
      if (bf16_.context) return context_by_pairs<NR>(acc, p, values, origin, keys);
    }
#endif
    tile::context_by_rows<NR>(acc, p, values, keys.first, keys.second, p_.dim_v);
  }

#if ATTN_TILE_BF16_DOT
  // accumulate_n's P V on AVX512-BF16 (bf16_.context): P rounded to bf16, keys in pairs from
  // the step's first key, the accumulators in tile::paired_position's order.
  template <int NR>
  ATTN_BF16_TARGET void context_by_pairs(float* const* acc, const float* const* p,
                                         const bfloat16* const* values, Index origin,
                                         std::pair<Index, Index> keys) const {
    tile::context_by_pairs_bf16<NR, tile::PairedOrder::paired>(acc, p, values, origin, keys.first,
                                                               keys.second, p_.dim_v);
  }
#endif

  static constexpr bool kInt8 = std::is_same_v<T, std::int8_t>;
  static constexpr bool kInt4 = std::is_same_v<T, Int4Pair>;
  static constexpr bool kScaled = kInt8 || kInt4;
  static constexpr bool kFloat8 = tile::kIsFloat8<T>;
  // Dtypes whose keys may carry a scale per row (int8) or KV head (fp8) in TileRows.
  static constexpr bool kRowScaled = kInt8 || kFloat8;

  const DecodeProblem& p_;
  const DecodeParts& plan_;
  Scratch& s_;
  State& partial_;
  State& state_;
  const tile::ScoreShaping shaping_{p_.rule.softcap, !p_.rule.alibi_slopes.empty()};
  const Bf16Products bf16_ = bf16_products<T>(p_);
  // Values whose dtype is not the keys': widened per tile by widen_other_values_, their
  // scales and offsets applied there, so every flag below is the keys' alone.
  const bool widen_values_ = p_.values.dtype != p_.keys.dtype;
  const WidenValues widen_other_values_ = widen_values_of(p_.values.dtype);
  // Whether widened values have scales (int8, int4, head-scaled fp8).
  const bool widened_value_scales_ =
      widen_values_ && (cache::has_scales(p_.values.dtype) || p_.values.head_scaled());
  // Rows read with their scale per group (int4, and int8 with groups on either side: per row
  // where there are none), and with an offset beside each scale.
  const bool grouped_ =
      kInt4 || (kInt8 && (p_.keys.group > 0 || (!widen_values_ && p_.values.group > 0)));
  const bool zero_point_ = grouped_ && p_.keys.zero_point;
  // int8 with a (scale, offset) pair per token: codes scored and accumulated as they are, the
  // scales and offsets applied per key in the shaper and the softmax (see softmax_row).
  const bool row_offsets_ = kInt8 && !grouped_ && p_.keys.zero_point;
  // Scores times each key's scale and weights times each value's: int8 with a scale per
  // token, fp8 where a pool has head scales (1 where the other has none).
  const bool row_scales_ =
      (kInt8 && !grouped_) ||
      (kFloat8 && (p_.keys.head_scaled() || (!widen_values_ && p_.values.head_scaled())));
  const bool value_scales_ = row_scales_ && !widen_values_;
  const bool value_offsets_ = row_offsets_ && !widen_values_;
  const Index key_scale_shift_ = scale_shift(p_.keys.group);
  const Index value_scale_shift_ = scale_shift(p_.values.group);
  // How far ahead lies the tile whose rows are asked to L2 (DecodeTraits).
  const std::size_t tiles_ahead_ = p_.keys.slots_interleave_heads() ? Traits::kTilesAheadTokenMajor
                                                                    : Traits::kTilesAheadHeadMajor;
  // Bytes of a stored key and value row, for the requests ahead of their reads.
  const Index key_row_bytes_ = cache::row_bytes(p_.keys.dtype, p_.dim);
  const Index value_row_bytes_ = cache::row_bytes(p_.values.dtype, p_.dim_v);
};

// The state row of (s, head, i) = the partial states of the parts holding it, merged in key
// order (the parts' order), after the merged tasks merged theirs.
void merge_parts(const DecodeProblem& p, const DecodeParts& plan, const State& partial,
                 State& state) {
  const float *pm = partial.m.data_as<float>(), *pl = partial.l.data_as<float>();
  const float* pacc = partial.acc.data_as<float>();
  for (std::size_t i = 0; i < plan.parts.size(); ++i) {
    const Index offset = plan.state_offset[i];
    if (offset < 0) continue;
    merge_part(p, plan.parts[i], pm + offset, pl + offset, pacc + offset * p.dim_v, state);
  }
}

template <class T>
void run(const DecodeProblem& p, State& state, int threads) {
  const DecodeParts plan = make_parts(p, threads);
  State partial{Tensor(DType::f32, {1, 1, plan.total_rows, 1}),
                Tensor(DType::f32, {1, 1, plan.total_rows, 1}),
                Tensor(DType::f32, {1, 1, plan.total_rows, p.dim_v})};
  const auto tasks = static_cast<Index>(plan.tasks.size());
  Index work = 0;
  for (const Part& part : plan.parts) {
    const Index row_groups = (part.rows + Traits::kRowsPerWork - 1) / Traits::kRowsPerWork;
    work += (part.key_end - part.key_begin) * p.heads_kv * row_groups;
  }
  const Index useful = std::min<Index>(tasks, work / Traits::kMinKeysPerThread + 1);
  threads = tile::threads_for(useful, threads);
  std::vector<Scratch> scratch;
  scratch.reserve(static_cast<std::size_t>(threads));
  const Bf16Products bf16 = bf16_products<T>(p);
  const bool merged_tasks = !plan.tasks.empty() && plan.tasks.front().merged;
  for (int t = 0; t < threads; ++t) {
    scratch.emplace_back(plan.max_rows, p.dim, p.dim_v, bf16.scores, merged_tasks && bf16.context);
  }
  tile::run_items(tasks, threads, [&](int thread) {
    return [&, kernel = TaskKernel<T>(p, plan, scratch[static_cast<std::size_t>(thread)], partial,
                                      state)](Index task) mutable {
      kernel.run(plan.tasks[static_cast<std::size_t>(task)]);
    };
  });
  merge_parts(p, plan, partial, state);
}

}  // namespace

void DecodeTarget(const DecodeProblem& problem, State& state, int threads) {
  with_stored_type(problem.keys.dtype, [&](auto stored) {
    run<typename decltype(stored)::type>(problem, state, threads);
  });
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(DecodeTarget);

void decode(const DecodeProblem& problem, State& state) {
  HWY_DYNAMIC_DISPATCH(DecodeTarget)(problem, state, resolve_threads(problem.threads));
}

}  // namespace attn::cpu
#endif
