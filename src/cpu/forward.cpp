// The fast forward kernel. Work items are (segment, KV head, block of query positions);
// an item's rows are every query head sharing the KV head at each of its positions, so
// each K/V tile is read once for the whole GQA group. For each key tile, per chunk of
// rows:
//   S^T = K Q^T    keys broadcast against query rows packed transposed (Qt, once per
//                  item), so neither K nor V needs packing when it is f32
//   softmax        vectorised over rows: running max m, sum l, rescale corr (DESIGN.md's
//                  state merge, one tile at a time); P overwrites S in place
//   O = O corr + P V   P broadcast against V rows
// Keys that causal / window hide for every row of a chunk are never computed; keys that
// a mask hides for a whole chunk are skipped too. Scores of hidden keys are overwritten
// with -inf (never added to), so their weight is exactly 0; a hidden V row with a NaN or
// infinity is skipped row by row instead of multiplied by 0. Extra memory: per thread,
// O(rows x (d + dv + key tile)) floats.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/half.hpp"
#include "core/element_type.hpp"
#include "core/mask.hpp"
#include "core/problem.hpp"
#include "core/visible_keys.hpp"
#include "cpu/forward.hpp"
#include "cpu/forward_traits.hpp"
#include "cpu/threads.hpp"

#include <hwy/contrib/math/math-inl.h>
#include "cpu/to_floats-inl.h"
#include "cpu/vector_exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using core::from_float;
using core::mask_hides;
using core::masked_score;
using core::MaskKind;
using core::Problem;
using core::round_up;
using core::row_of;
using core::Segment;
using core::with_element_type;
using core::with_float_type;

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// One unit of parallel work; its result depends on nothing else, so any thread count
// gives the same bits.
struct WorkItem {
  Index segment = 0, kv_head = 0, first_position = 0, positions = 0;
};

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

// Per-thread scratch, allocated before the parallel loop; every buffer is 64-byte aligned
// (HWY_ALIGNMENT) and padded to whole cache lines so threads never share a line.
struct Scratch {
  template <class T>
  static hwy::AlignedFreeUniquePtr<T[]> buffer(Index count) {
    constexpr Index kLine = 64, kSize = sizeof(T);
    const Index bytes = round_up(std::max<Index>(count, 1) * kSize, kLine);
    return hwy::AllocateAligned<T>(static_cast<std::size_t>((bytes + kSize - 1) / kSize));
  }

  Scratch(Index rows, Index dim, Index dim_v_padded, Index key_tile, Index score_keys)
      : queries_t(buffer<float>(dim * rows)),
        queries(buffer<float>(dim * rows)),
        scores(buffer<float>((key_tile + score_keys) * rows)),
        context(buffer<float>(rows * dim_v_padded)),
        keys(buffer<float>(key_tile * dim)),
        values(buffer<float>(key_tile * dim_v_padded)),
        row_max(buffer<float>(rows)),
        row_sum(buffer<float>(rows)),
        rescale(buffer<float>(rows)),
        slope(buffer<float>(rows)),
        first_key(buffer<std::int32_t>(rows)),
        end_key(buffer<std::int32_t>(rows)),
        position(buffer<std::int32_t>(rows)),
        head(buffer<Index>(rows)),
        query_row(buffer<Index>(rows)),
        row_buffer(buffer<float>(std::max(dim, dim_v_padded))),
        chunks(buffer<Chunk>(rows)),
        blocks(buffer<RowBlock>(rows)) {}

  hwy::AlignedFreeUniquePtr<float[]> queries_t;  // [dim][rows]: scale * q, transposed
  hwy::AlignedFreeUniquePtr<float[]> queries;    // [rows][dim]: scale * q, for narrow chunks
  hwy::AlignedFreeUniquePtr<float[]> scores;     // [key_tile + score_keys][rows]: S^T, then P^T
  hwy::AlignedFreeUniquePtr<float[]> context;    // [rows][dim_v_padded]: unnormalised O
  hwy::AlignedFreeUniquePtr<float[]> keys;       // [key_tile][dim]: K tile in f32 (f16/bf16 k)
  hwy::AlignedFreeUniquePtr<float[]> values;     // [key_tile][dim_v_padded]: V tile in f32
  hwy::AlignedFreeUniquePtr<float[]> row_max, row_sum, rescale, slope;     // [rows]
  hwy::AlignedFreeUniquePtr<std::int32_t[]> first_key, end_key, position;  // [rows]
  hwy::AlignedFreeUniquePtr<Index[]> head, query_row;                      // [rows]
  hwy::AlignedFreeUniquePtr<float[]> row_buffer;                           // [max(dim, dv)]
  hwy::AlignedFreeUniquePtr<Chunk[]> chunks;     // of the current tile (at most one per row)
  hwy::AlignedFreeUniquePtr<RowBlock[]> blocks;  // of the current tile (at most one per row)
};

// S^T[key k][row] = sum_d K[k][d] Qt[d][row] for kScoreKeys keys and C row vectors.
// qt: [dim][rows_stride] (at the chunk's first row)  keys: kScoreKeys row pointers
// out: [kScoreKeys][rows_stride]
template <int kDim, int C, int kKeys>
HWY_INLINE void score_block(const float* HWY_RESTRICT qt, Index rows_stride,
                            const float* const* keys, Index runtime_dim, float* HWY_RESTRICT out) {
  const DF df;
  const Index lanes = static_cast<Index>(hn::Lanes(df));
  const Index dim = kDim > 0 ? kDim : runtime_dim;
  VF acc[kKeys][C];
  for (int k = 0; k < kKeys; ++k)
    for (int c = 0; c < C; ++c) acc[k][c] = hn::Zero(df);
  for (Index d = 0; d < dim; ++d) {
    VF q[C];
    for (int c = 0; c < C; ++c) q[c] = hn::Load(df, qt + d * rows_stride + c * lanes);
    for (int k = 0; k < kKeys; ++k) {
      const VF key = hn::Set(df, keys[k][d]);
      for (int c = 0; c < C; ++c) acc[k][c] = hn::MulAdd(q[c], key, acc[k][c]);
    }
  }
  for (int k = 0; k < kKeys; ++k)
    for (int c = 0; c < C; ++c) hn::Store(acc[k][c], df, out + k * rows_stride + c * lanes);
}

// O[r][:C vectors] = O[r] * rescale[r] + sum_{j in [first, end)} P^T[j][r] V[j] for
// kRows rows. p: P^T at (first key, first row), stride rows_stride
// v: V at the first key and the block's first column, stride v_stride
// o: O at (first row, first column), stride o_stride
template <int C, int kRows>
HWY_INLINE void context_block(const float* HWY_RESTRICT p, Index rows_stride,
                              const float* HWY_RESTRICT v, Index v_stride, Index keys,
                              const float* HWY_RESTRICT rescale, float* HWY_RESTRICT o,
                              Index o_stride) {
  const DF df;
  const Index lanes = static_cast<Index>(hn::Lanes(df));
  VF acc[kRows][C];
  for (int r = 0; r < kRows; ++r) {
    const VF factor = hn::Set(df, rescale[r]);
    for (int c = 0; c < C; ++c)
      acc[r][c] = hn::Mul(hn::Load(df, o + r * o_stride + c * lanes), factor);
  }
  for (Index j = 0; j < keys; ++j) {
    VF value[C];
    for (int c = 0; c < C; ++c) value[c] = hn::LoadU(df, v + j * v_stride + c * lanes);
    for (int r = 0; r < kRows; ++r) {
      const VF weight = hn::Set(df, p[j * rows_stride + r]);
      for (int c = 0; c < C; ++c) acc[r][c] = hn::MulAdd(weight, value[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < C; ++c) hn::Store(acc[r][c], df, o + r * o_stride + c * lanes);
}

template <int kDim>
class ItemKernel {
  using Traits = ForwardTraits<kDim>;

 public:
  ItemKernel(const Problem& problem, Scratch& scratch) : p_(problem), s_(scratch) {}

  void run(const WorkItem& item) {
    seg_ = &p_.segments[static_cast<std::size_t>(item.segment)];
    kv_head_ = item.kv_head;
    const Index group = p_.group_size();
    rows_ = item.positions * group;
    rows_padded_ = round_up(rows_, lanes_);
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
  // Per row: its head, its query, and the keys [first_key, end_key) that causal and the
  // window leave visible; the online-softmax state starts at the sink (or empty).
  void set_up_rows(const WorkItem& item) {
    const Index group = p_.group_size();
    for (Index t = 0; t < item.positions; ++t) {
      const Index i = item.first_position + t;
      const Index position = p_.query_position(*seg_, i);
      const core::KeyRange keys = core::visible_keys(p_.causal, p_.window, position, seg_->len_k);
      const Index first = keys.first, end = std::max(keys.end, keys.first);
      for (Index g = 0; g < group; ++g) {
        const Index r = t * group + g, head = kv_head_ * group + g;
        s_.head[r] = head;
        s_.query_row[r] = seg_->q_begin + i;
        s_.first_key[r] = static_cast<std::int32_t>(first);
        s_.end_key[r] = static_cast<std::int32_t>(std::max<Index>(end, 0));
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

  // Qt[d][r] = scale * q[head r][query r][d]; padding rows are 0.
  void pack_queries() {
    float* qt = s_.queries_t.get();
    const auto scale = static_cast<float>(p_.scale);
    with_float_type(p_.q.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        for (Index r = 0; r < rows_; ++r) {
          to_floats(row_of<T>(p_.q, seg_->batch, s_.head[r], s_.query_row[r]), dim_,
                    s_.row_buffer.get());
          for (Index d = 0; d < dim_; ++d) {
            qt[d * rows_padded_ + r] = s_.queries[r * dim_ + d] = scale * s_.row_buffer[d];
          }
        }
      }
    });
    for (Index d = 0; d < dim_; ++d) {
      std::fill(qt + d * rows_padded_ + rows_, qt + (d + 1) * rows_padded_, 0.0f);
    }
  }

  void attend_tile(Index tile_first, Index tile_end) {
    tile_first_ = tile_first;
    Chunk* chunks = s_.chunks.get();
    Index chunk_count = 0;
    bool any_partial = false;
    const Index vectors = rows_padded_ / lanes_;
    for (Index v = 0; v < vectors; v += Traits::kScoreRowVectors) {
      Chunk chunk;
      chunk.first_row = v * lanes_;
      chunk.vectors = std::min<Index>(Traits::kScoreRowVectors, vectors - v);
      if (plan_chunk(tile_first, tile_end, chunk)) {
        any_partial |= !chunk.every_row_sees_all;
        chunks[chunk_count++] = chunk;
      }
    }
    if (chunk_count == 0) return;
    load_tile(tile_first, tile_end);
    for (Index c = 0; c < chunk_count; ++c) {
      compute_scores(chunks[c]);
      shape_scores(chunks[c]);
      update_softmax(chunks[c]);
    }
    const bool values_finite = !any_partial || tile_values_finite(tile_end - tile_first);
    accumulate_context(chunks, chunk_count, values_finite);
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
    // A chunk with at most a quarter of a vector of real rows (decoding one token) would
    // waste most lanes broadcasting keys against Qt; dot products read each key once.
    chunk.narrow = (row_end - chunk.first_row) * 4 <= lanes_;
    // Narrow scores leave padding rows unwritten; hiding them needs the per-key pass.
    chunk.every_row_sees_all = sees_all && !chunk.narrow;
    return p_.mask_kind == MaskKind::none || mask_shows_any(chunk, row_end);
  }

  bool mask_shows_any(const Chunk& chunk, Index row_end) const {
    bool shown = false;
    with_element_type(p_.mask.dtype, [&](auto tag) {
      using M = decltype(tag);
      for (Index r = chunk.first_row; r < row_end && !shown; ++r) {
        const M* row = row_of<M>(p_.mask, seg_->batch, s_.head[r], s_.query_row[r]) + seg_->k_begin;
        const Index first = std::max<Index>(s_.first_key[r], chunk.first);
        const Index end = std::min<Index>(s_.end_key[r], chunk.end);
        for (Index j = first; j < end; ++j) {
          if (!mask_hides(row[j])) {
            shown = true;
            break;
          }
        }
      }
    });
    return shown;
  }

  // K and V rows of the tile as f32: the inputs themselves when they are f32 (and V's rows
  // are whole vectors), else converted into scratch.
  void load_tile(Index tile_first, Index tile_end) {
    const Index keys = tile_end - tile_first, first_key = seg_->k_begin + tile_first;
    with_float_type(p_.k.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, float>) {
        keys_ = row_of<float>(p_.k, seg_->batch, kv_head_, first_key);
        key_stride_ = p_.k.strides[2];
      } else if constexpr (!std::is_same_v<T, double>) {
        for (Index j = 0; j < keys; ++j) {
          to_floats(row_of<T>(p_.k, seg_->batch, kv_head_, first_key + j), dim_,
                    s_.keys.get() + j * dim_);
        }
        keys_ = s_.keys.get();
        key_stride_ = dim_;
      }
    });
    with_float_type(p_.v.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, float>) {
        if (dim_v_ == dim_v_padded_) {
          values_ = row_of<float>(p_.v, seg_->batch, kv_head_, first_key);
          value_stride_ = p_.v.strides[2];
          return;
        }
      }
      if constexpr (!std::is_same_v<T, double>) {
        for (Index j = 0; j < keys; ++j) {
          float* out = s_.values.get() + j * dim_v_padded_;
          to_floats(row_of<T>(p_.v, seg_->batch, kv_head_, first_key + j), dim_v_, out);
          std::fill(out + dim_v_, out + dim_v_padded_, 0.0f);
        }
        values_ = s_.values.get();
        value_stride_ = dim_v_padded_;
      }
    });
  }

  bool tile_values_finite(Index keys) const {
    const DF df;
    VF zeros = hn::Zero(df);
    for (Index j = 0; j < keys; ++j) {
      const float* row = values_ + j * value_stride_;
      Index d = 0;
      for (; d + lanes_ <= dim_v_; d += lanes_)
        zeros = hn::MulAdd(hn::LoadU(df, row + d), hn::Zero(df), zeros);
      for (; d < dim_v_; ++d) {
        if (!std::isfinite(row[d])) return false;
      }
    }
    return hn::AllTrue(df, hn::Eq(zeros, hn::Zero(df)));
  }

  const float* key_row(Index j) const { return keys_ + (j - tile_first_) * key_stride_; }
  float* scores_at(Index j, Index row) const {
    return s_.scores.get() + (j - tile_first_) * rows_padded_ + row;
  }

  void compute_scores(const Chunk& chunk) {
    if (chunk.narrow) {
      compute_scores_by_dot(chunk);
      return;
    }
    switch (chunk.vectors) {
      case 1:
        compute_scores<1>(chunk);
        return;
      case 2:
        compute_scores<2>(chunk);
        return;
      default:
        compute_scores<Traits::kScoreRowVectors>(chunk);
        return;
    }
  }

  template <int C>
  void compute_scores(const Chunk& chunk) {
    constexpr int kKeys = Traits::kScoreKeys;
    const float* qt = s_.queries_t.get() + chunk.first_row;
    Index j = chunk.first;
    for (; j + kKeys <= chunk.end; j += kKeys) {
      const float* keys[kKeys];
      for (int k = 0; k < kKeys; ++k) keys[k] = key_row(j + k);
      score_block<kDim, C, kKeys>(qt, rows_padded_, keys, dim_, scores_at(j, chunk.first_row));
    }
    for (; j < chunk.end; ++j) {
      const float* keys[1] = {key_row(j)};
      score_block<kDim, C, 1>(qt, rows_padded_, keys, dim_, scores_at(j, chunk.first_row));
    }
  }

  // S^T[j][r] = q_r . k_j for the chunk's real rows, kScoreKeys keys at a time.
  void compute_scores_by_dot(const Chunk& chunk) {
    const DF df;
    constexpr Index kKeys = Traits::kScoreKeys;
    const Index row_end = std::min(rows_, chunk.first_row + chunk.vectors * lanes_);
    const Index whole = dim_ - dim_ % lanes_;
    for (Index r = chunk.first_row; r < row_end; ++r) {
      const float* q = s_.queries.get() + r * dim_;
      for (Index j = chunk.first; j < chunk.end; j += kKeys) {
        const Index keys = std::min(kKeys, chunk.end - j);
        const float* k[kKeys];
        for (Index i = 0; i < kKeys; ++i) k[i] = key_row(j + std::min(i, keys - 1));
        VF acc[kKeys];
        for (Index i = 0; i < kKeys; ++i) acc[i] = hn::Zero(df);
        for (Index d = 0; d < whole; d += lanes_) {
          const VF qv = hn::LoadU(df, q + d);
          for (Index i = 0; i < kKeys; ++i)
            acc[i] = hn::MulAdd(qv, hn::LoadU(df, k[i] + d), acc[i]);
        }
        for (Index i = 0; i < keys; ++i) {
          float dot = hn::GetLane(hn::SumOfLanes(df, acc[i]));
          for (Index d = whole; d < dim_; ++d) dot += q[d] * k[i][d];
          *scores_at(j + i, r) = dot;
        }
      }
    }
  }

  // softcap, ALiBi, then hiding: keys outside a row's causal/window range, then the mask.
  void shape_scores(const Chunk& chunk) {
    const DF df;
    const DI di;
    const bool softcap = p_.softcap > 0.0, alibi = !p_.alibi_slopes.empty();
    if (softcap || alibi || !chunk.every_row_sees_all) {
      const VF cap = hn::Set(df, static_cast<float>(p_.softcap));
      const VF inverse_cap = hn::Set(df, softcap ? static_cast<float>(1.0 / p_.softcap) : 0.0f);
      const VF hidden = hn::Set(df, kMinusInfinity);
      for (Index c = 0; c < chunk.vectors; ++c) {
        const Index row = chunk.first_row + c * lanes_;
        const auto first = hn::Load(di, s_.first_key.get() + row);
        const auto end = hn::Load(di, s_.end_key.get() + row);
        const auto position = hn::Load(di, s_.position.get() + row);
        const VF slope = hn::Load(df, s_.slope.get() + row);
        for (Index j = chunk.first; j < chunk.end; ++j) {
          float* at = scores_at(j, row);
          VF s = hn::Load(df, at);
          if (softcap) s = hn::Mul(cap, hn::Tanh(df, hn::Mul(s, inverse_cap)));
          const auto key = hn::Set(di, static_cast<std::int32_t>(j));
          if (alibi) {
            const VF distance = hn::Abs(hn::ConvertTo(df, hn::Sub(position, key)));
            s = hn::NegMulAdd(slope, distance, s);
          }
          if (!chunk.every_row_sees_all) {
            const auto shown = hn::AndNot(hn::Lt(key, first), hn::Lt(key, end));
            s = hn::IfThenElse(hn::RebindMask(df, shown), s, hidden);
          }
          hn::Store(s, df, at);
        }
      }
    }
    if (p_.mask_kind != MaskKind::none) apply_mask(chunk);
  }

  void apply_mask(const Chunk& chunk) {
    const Index row_end = std::min(rows_, chunk.first_row + chunk.vectors * lanes_);
    with_element_type(p_.mask.dtype, [&](auto tag) {
      using M = decltype(tag);
      for (Index r = chunk.first_row; r < row_end; ++r) {
        const M* row = row_of<M>(p_.mask, seg_->batch, s_.head[r], s_.query_row[r]) + seg_->k_begin;
        for (Index j = chunk.first; j < chunk.end; ++j) {
          float* at = scores_at(j, r);
          *at = masked_score(*at, row[j]);
        }
      }
    });
  }

  // The state merge of DESIGN.md with the tile's scores, vectorised over rows; P
  // overwrites S, and rescale[r] = exp(m_old - m_new) is left for accumulate_context.
  void update_softmax(const Chunk& chunk) {
    const DF df;
    const VF minus_infinity = hn::Set(df, kMinusInfinity);
    for (Index c = 0; c < chunk.vectors; ++c) {
      const Index row = chunk.first_row + c * lanes_;
      const VF old_max = hn::Load(df, s_.row_max.get() + row);
      VF new_max = old_max;
      // Like the reference, the max ignores a NaN score (x86 max returns its second operand
      // when either is NaN); the NaN still reaches l and O through exp (see finish).
      for (Index j = chunk.first; j < chunk.end; ++j)
        new_max = hn::Max(hn::Load(df, scores_at(j, row)), new_max);
      // With nothing visible yet, subtract 0 so that exp(-inf - 0) = 0, not NaN.
      const VF shift = hn::IfThenZeroElse(hn::Eq(new_max, minus_infinity), new_max);
      const VF rescale = VectorExp(df, hn::Sub(old_max, shift));
      VF sum0 = hn::Zero(df), sum1 = hn::Zero(df);
      Index j = chunk.first;
      for (; j + 2 <= chunk.end; j += 2) {
        float* at0 = scores_at(j, row);
        float* at1 = scores_at(j + 1, row);
        const VF p0 = VectorExp(df, hn::Sub(hn::Load(df, at0), shift));
        const VF p1 = VectorExp(df, hn::Sub(hn::Load(df, at1), shift));
        hn::Store(p0, df, at0);
        hn::Store(p1, df, at1);
        sum0 = hn::Add(sum0, p0);
        sum1 = hn::Add(sum1, p1);
      }
      if (j < chunk.end) {
        float* at = scores_at(j, row);
        const VF p = VectorExp(df, hn::Sub(hn::Load(df, at), shift));
        hn::Store(p, df, at);
        sum0 = hn::Add(sum0, p);
      }
      const VF old_sum = hn::Load(df, s_.row_sum.get() + row);
      hn::Store(hn::MulAdd(old_sum, rescale, hn::Add(sum0, sum1)), df, s_.row_sum.get() + row);
      hn::Store(new_max, df, s_.row_max.get() + row);
      hn::Store(rescale, df, s_.rescale.get() + row);
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
      // The widest blocks, but a remainder of 1 after them becomes 2 + 2: a 1-vector block
      // has too few accumulators to hide the FMA latency.
      constexpr Index kWidest = Traits::kContextVectors;
      const Index left = vectors - v;
      const Index width =
          left == kWidest + 1 && kWidest > 2 ? kWidest - 1 : std::min(left, kWidest);
      for (Index b = 0; b < block_count; ++b) {
        if (!blocks[b].skip_hidden_by_row) context_columns(blocks[b], v * lanes_, width);
      }
      v += width;
    }
    for (Index b = 0; b < block_count; ++b) {
      if (blocks[b].skip_hidden_by_row) context_skipping_hidden(blocks[b]);
    }
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
    switch (width) {
      case 1:
        context_block<1, kRows>(p, rows_padded_, v, value_stride_, keys, rescale, o, dim_v_padded_);
        return;
      case 2:
        context_block<2, kRows>(p, rows_padded_, v, value_stride_, keys, rescale, o, dim_v_padded_);
        return;
      default:
        context_block<3, kRows>(p, rows_padded_, v, value_stride_, keys, rescale, o, dim_v_padded_);
        return;
    }
  }

  // A V row holding NaN or infinity must not reach rows that do not see its key, where
  // 0 * NaN would: here each row adds only the keys with a non-zero weight.
  void context_skipping_hidden(const RowBlock& block) {
    const DF df;
    for (Index r = block.first_row; r < block.first_row + block.rows; ++r) {
      float* o = s_.context.get() + r * dim_v_padded_;
      const VF rescale = hn::Set(df, s_.rescale[r]);
      for (Index d = 0; d < dim_v_padded_; d += lanes_)
        hn::Store(hn::Mul(hn::Load(df, o + d), rescale), df, o + d);
      for (Index j = block.first; j < block.end; ++j) {
        const float weight = *scores_at(j, r);
        if (weight == 0.0f) continue;
        const float* v = values_ + (j - tile_first_) * value_stride_;
        const VF w = hn::Set(df, weight);
        for (Index d = 0; d < dim_v_padded_; d += lanes_) {
          hn::Store(hn::MulAdd(w, hn::LoadU(df, v + d), hn::Load(df, o + d)), df, o + d);
        }
      }
    }
  }

  // context = O / l (0 for a row with no visible key), lse = m + log(l) (-inf then). A row
  // with no visible key has m = -inf and l = 0; a NaN score leaves l NaN even where
  // hn::Max dropped it from m, and the row reports NaN (context and lse), as the reference.
  void finish() const {
    for (Index r = 0; r < rows_; ++r) {
      const float sum = s_.row_sum[r], row_max = s_.row_max[r];
      const bool empty = row_max == kMinusInfinity && sum == 0.0f;
      const float inverse = empty ? 0.0f : 1.0f / sum;
      const float* o = s_.context.get() + r * dim_v_padded_;
      const MutableTensorView& out = p_.outputs.context;
      with_float_type(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* row = static_cast<T*>(out.data) + seg_->batch * out.strides[0] +
                 s_.head[r] * out.strides[1] + s_.query_row[r] * out.strides[2];
        for (Index d = 0; d < dim_v_; ++d) row[d] = from_float<T>(o[d] * inverse);
      });
      if (p_.outputs.lse) {
        const MutableTensorView& lse = *p_.outputs.lse;
        const double value =
            empty ? -std::numeric_limits<double>::infinity()
                  : static_cast<double>(row_max) + std::log(static_cast<double>(sum));
        const Index at = seg_->batch * lse.strides[0] + s_.head[r] * lse.strides[1] +
                         s_.query_row[r] * lse.strides[2];
        if (lse.dtype == DType::f64) {
          static_cast<double*>(lse.data)[at] = value;
        } else {
          static_cast<float*>(lse.data)[at] = static_cast<float>(value);
        }
      }
    }
  }

  const Problem& p_;
  Scratch& s_;
  const Index lanes_ = static_cast<Index>(hn::Lanes(DF()));
  // Context blocks never straddle two row chunks: 4 rows, or 1 on the 1-lane target.
  const Index block_rows_ = lanes_ >= Traits::kContextRows ? Traits::kContextRows : 1;
  const Index dim_ = kDim > 0 ? kDim : p_.dim_qk;
  const Index dim_v_ = kDim > 0 ? kDim : p_.dim_v;
  const Index dim_v_padded_ = round_up(dim_v_, lanes_);
  const Segment* seg_ = nullptr;
  Index kv_head_ = 0, rows_ = 0, rows_padded_ = 0, tile_first_ = 0;
  const float* keys_ = nullptr;
  const float* values_ = nullptr;
  Index key_stride_ = 0, value_stride_ = 0;
};

template <int kDim>
void run_kernel(const Problem& p, int threads) {
  using Traits = ForwardTraits<kDim>;
  const Index lanes = static_cast<Index>(hn::Lanes(DF()));
  const Index group = p.group_size();
  const Index positions = std::max<Index>(1, Traits::kRowVectorsPerItem * lanes / group);
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
  threads = static_cast<int>(std::min<Index>(threads, static_cast<Index>(items.size())));
  const Index rows = round_up(positions * group, lanes);
  const Index dim_v_padded = round_up(p.dim_v, lanes);
  std::vector<Scratch> scratch;
  scratch.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    scratch.emplace_back(rows, p.dim_qk, dim_v_padded, Traits::kKeyTile, Traits::kScoreKeys);
  }
  const auto count = static_cast<std::int64_t>(items.size());
#pragma omp parallel num_threads(threads)
  {
    ItemKernel<kDim> kernel(p, scratch[static_cast<std::size_t>(omp_get_thread_num())]);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < count; ++i) kernel.run(items[static_cast<std::size_t>(i)]);
  }
}

// The compile-time head-dim switch: the dims of common models get their own copy of the
// kernel, with loop bounds known to the compiler; every other dim runs the generic one.
// Measured: the generic copy runs d=64 and d=128 within 2% of their own copies (the
// micro-kernels are FMA-bound either way), so the copies are insurance for other compilers.
// Sanitizer builds (ATTN_GENERIC_HEAD_DIM_ONLY) compile the generic copy alone: the copies
// differ only in constant loop bounds, and six copies per target cost minutes under ASan.
template <class Fn>
void with_head_dim([[maybe_unused]] Index dim_qk, [[maybe_unused]] Index dim_v, Fn&& fn) {
#ifndef ATTN_GENERIC_HEAD_DIM_ONLY
  if (dim_qk == dim_v) {
    switch (dim_qk) {
      case 64:
        fn(std::integral_constant<int, 64>{});
        return;
      case 80:
        fn(std::integral_constant<int, 80>{});
        return;
      case 96:
        fn(std::integral_constant<int, 96>{});
        return;
      case 128:
        fn(std::integral_constant<int, 128>{});
        return;
      case 256:
        fn(std::integral_constant<int, 256>{});
        return;
      default:
        break;
    }
  }
#endif
  fn(std::integral_constant<int, 0>{});
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
