// The fast weights pass. A work item is up to kItemRows output rows that share a segment
// and a KV head, so each K tile is read once for the rows of a GQA group. Per item, over
// key tiles, with the pieces of cpu/tile/:
//   S = Q K^T     keys-vectorised: query rows broadcast against K^T (one transposed f32
//                 copy of K, made before the items), row-major so that every output row
//                 is written contiguously. Each score is computed by the micro-kernel the
//                 forward kernel uses for it (the same FMA chain over d, the dot kernel for
//                 the rows forward scores by dot products, or, for bf16 q and k on
//                 AVX512-BF16, forward's bf16 dot products, transposed into the rows), so
//                 the scores are its scores
//   shaping       the shared score shaper: softcap, ALiBi, hiding (causal / window range,
//                 mask) to -inf
//   statistics    the shared online softmax: max m and sum l per row, a tile at a time;
//                 top-k keeps a k-sized heap of (score, key) per row in this pass, since
//                 exp(s - lse) ranks keys as s does
//   emit          alpha = exp(s - m) / l, streamed into the output row by row
// attn::forward hands over its kernel's lse, and then the statistics pass is skipped.
// Hidden keys get exactly 0, and a NaN in a hidden key never reaches a weight. Extra memory
// per thread: O(kItemRows x (D + kKeyTile + k)) floats, and one f32 copy of K (transposed;
// none for bf16 dot products, which read K in place); never Lq x Lk.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/weights.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attn/half.hpp"
#include "core/element_type.hpp"
#include "core/mask.hpp"
#include "core/problem.hpp"
#include "core/visible_keys.hpp"
#include "core/weight_request.hpp"
#include "cpu/amx/kernels.hpp"
#include "cpu/bf16_dot.hpp"
#include "cpu/forward_traits.hpp"
#include "cpu/amx/fp16_parts.hpp"
#include "cpu/amx/key_parts-inl.h"
#include "cpu/keys_transposed-inl.h"
#include "cpu/threads.hpp"
#include "cpu/top_k.hpp"
#include "cpu/weights.hpp"
#include "cpu/weights_traits.hpp"

#include "cpu/tile/run-inl.h"
#include "cpu/tile/score_kernels-inl.h"
#include "cpu/tile/shaping-inl.h"
#include "cpu/tile/softmax-inl.h"
#include "cpu/tile/target-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using core::from_float;
using core::MaskKind;
using core::Problem;
using core::round_up;
using core::row_of;
using core::Segment;
using core::WeightRequest;
using core::WeightRow;
using core::with_element_type;
using core::with_float_type;
using tile::DF;
using tile::DI;
using tile::kMinusInfinity;
using tile::VF;
using Traits = WeightsTraits;
constexpr Index kKeyTile = Traits::kKeyTile;
constexpr Index kItemRows = Traits::kItemRows;
constexpr Index kScoreRows = Traits::kScoreRows;
static_assert(kItemRows % kBf16RowsPerVector == 0, "bf16 dot products take 16 rows a vector");

// Output rows [first, first + count) of the row list; they share a segment and a KV head.
struct WorkItem {
  Index first = 0, count = 0;
};

// Per-thread scratch, allocated before the parallel loop (tile::scratch_buffer).
struct Scratch {
  Scratch(Index dim, Index heap_capacity, bool bf16_dot, bool fp16_parts)
      : queries(tile::scratch_buffer<float>(kItemRows * dim)),
        query_pairs(tile::scratch_buffer<std::uint16_t>(
            bf16_dot ? kItemRows * dim : (fp16_parts ? 4 * kItemRows * dim : 0))),
        rows_finite(tile::scratch_buffer<std::uint8_t>(fp16_parts ? kItemRows : 0)),
        scores(tile::scratch_buffer<float>(kItemRows * kKeyTile)),
        scores_t(tile::scratch_buffer<float>(bf16_dot || fp16_parts ? kKeyTile * kItemRows : 0)),
        out_row(tile::scratch_buffer<float>(std::max(kKeyTile, heap_capacity + kKeyTile))),
        heap(static_cast<std::size_t>(kItemRows * heap_capacity)) {}

  hwy::AlignedFreeUniquePtr<float[]> queries;  // [kItemRows][dim]: scale * q
  // bf16 dot products only: [dim / 2][kItemRows][2] bf16 q as forward pairs it, and
  // [kKeyTile][kItemRows] the tile's S^T they give (cpu/bf16_dot.hpp); fp16 parts only:
  // [2][dim][kItemRows][2] (put_query_parts, cpu/amx/fp16_parts.hpp), whether each row is
  // finite, and S^T
  hwy::AlignedFreeUniquePtr<std::uint16_t[]> query_pairs;
  hwy::AlignedFreeUniquePtr<std::uint8_t[]> rows_finite;
  hwy::AlignedFreeUniquePtr<float[]> scores;  // [kItemRows][kKeyTile]: S of the tile
  hwy::AlignedFreeUniquePtr<float[]> scores_t;
  hwy::AlignedFreeUniquePtr<float[]> out_row;  // one tile of weights, or one top-k row
  std::vector<Candidate> heap;                 // [kItemRows][heap_capacity]
};

class ItemKernel {
 public:
  ItemKernel(const Problem& problem, const WeightRequest& request,
             const std::vector<WeightRow>& rows, const KeysTransposed& keys,
             const KeyParts& key_parts, Index heap_capacity, bool bf16_dot, bool fp16_parts,
             Scratch& scratch)
      : p_(problem),
        r_(request),
        list_(rows),
        keys_(keys),
        key_parts_(key_parts),
        heap_capacity_(heap_capacity),
        s_(scratch),
        bf16_dot_(bf16_dot),
        fp16_parts_(fp16_parts) {}

  void run(const WorkItem& item) {
    set_up_rows(item);
    Index lo = std::numeric_limits<Index>::max(), hi = 0;
    for (Index r = 0; r < rows_; ++r) {
      if (row_[r].first >= row_[r].end) continue;
      lo = std::min(lo, row_[r].first);
      hi = std::max(hi, row_[r].end);
    }
    // Tiles at multiples of kKeyTile, so that a row's bits do not depend on its item.
    const Index tile_lo = lo < hi ? lo / kKeyTile * kKeyTile : 0;
    if (!top_k_) zero_outside(tile_lo, std::max(hi, tile_lo));
    if (!r_.lse || top_k_) {
      for (Index tile = tile_lo; tile < hi; tile += kKeyTile) {
        sweep_tile(tile, std::min(tile + kKeyTile, hi), Pass::statistics);
      }
    }
    normalise();
    if (top_k_) {
      for (Index r = 0; r < rows_; ++r) write_top_k(r);
      return;
    }
    for (Index tile = tile_lo; tile < hi; tile += kKeyTile) {
      sweep_tile(tile, std::min(tile + kKeyTile, hi), Pass::emit);
    }
  }

 private:
  enum class Pass : std::uint8_t { statistics, emit };

  struct Row {
    Index head = 0, query_row = 0, position = 0;
    Index first = 0, end = 0;  // keys (relative to the segment) causal and the window leave
    Index out_head = 0, out_row = 0;
    float slope = 0.0f;
    // The online-softmax state; l in double, so that rows sum to 1 within a few float
    // ulps however many tiles were merged.
    float row_max = kMinusInfinity;
    double row_sum = 0.0;
    WeightScale scale{0.0f, 0.0f};  // alpha = exp(s - shift) * factor
    TopK best;
    bool by_dot = false;  // scored by dot products, as the forward kernel scores this row
  };

  // Per row: its head, query, visible key range and starting state (the sink, or empty);
  // Q rows scaled into scratch, padding rows zero.
  void set_up_rows(const WorkItem& item) {
    const WeightRow& lead = list_[static_cast<std::size_t>(item.first)];
    seg_ = &p_.segments[static_cast<std::size_t>(lead.segment)];
    kv_head_ = lead.head / p_.group_size();
    rows_ = item.count;
    rows_padded_ = round_up(rows_, kScoreRows);
    const auto scale = static_cast<float>(p_.scale);
    for (Index r = 0; r < rows_; ++r) {
      const WeightRow& w = list_[static_cast<std::size_t>(item.first + r)];
      Row& row = row_[r];
      row = Row{};
      row.best = TopK(s_.heap.data() + r * heap_capacity_, heap_capacity_);
      row.head = w.head;
      row.query_row = seg_->q_begin + w.i;
      row.position = p_.query_position(*seg_, w.i);
      row.out_head = w.out_head;
      row.out_row = w.out_row;
      const core::KeyRange keys =
          core::visible_keys(p_.causal, p_.window, row.position, seg_->len_k);
      row.first = keys.first;
      row.end = keys.end;
      row.slope = p_.alibi_slopes.empty() ? 0.0f : p_.alibi_slopes[row.head];
      row.by_dot = forward_scores_by_dot(seg_->len_q, w.i, row.head % p_.group_size(),
                                         p_.group_size(), lanes_, forward_widens_);
      if (!p_.sinks.empty() && p_.sinks[row.head] != kMinusInfinity) {
        row.row_max = p_.sinks[row.head];
        row.row_sum = 1.0;
      }
      with_float_type(p_.q.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, double>) {
          tile::scaled_query(row_of<T>(p_.q, seg_->batch, row.head, row.query_row), dim_, scale,
                             s_.queries.get() + r * dim_);
        }
      });
    }
    for (Index r = rows_; r < rows_padded_; ++r) {
      row_[r] = Row{};
      std::fill(s_.queries.get() + r * dim_, s_.queries.get() + (r + 1) * dim_, 0.0f);
    }
    if (bf16_dot_) pack_query_pairs();
    if (fp16_parts_) pack_query_parts();
  }

  // The item's fp16 q rows as forward's parts (put_query_parts, kItemRows rows per pair of d);
  // rows past the item's are 0.
  void pack_query_parts() {
    std::uint16_t* pairs = s_.query_pairs.get();
    std::fill(pairs, pairs + 4 * kItemRows * dim_, std::uint16_t{0});
    std::fill(s_.rows_finite.get(), s_.rows_finite.get() + kItemRows, std::uint8_t{1});
    alignas(64) float q[kAmxMaxDim];
    for (Index r = 0; r < rows_; ++r) {
      to_floats(row_of<float16>(p_.q, seg_->batch, row_[r].head, row_[r].query_row), dim_, q);
      s_.rows_finite[r] = put_query_parts(q, dim_, r, kItemRows, pairs);
    }
  }

  // The item's bf16 q rows as the dot instruction pairs them (put_query_pairs, kItemRows
  // rows per pair of d); rows past the item's are 0.
  void pack_query_pairs() {
    std::uint16_t* pairs = s_.query_pairs.get();
    std::fill(pairs, pairs + kItemRows * dim_, std::uint16_t{0});
    for (Index r = 0; r < rows_; ++r) {
      put_query_pairs(row_of<bfloat16>(p_.q, seg_->batch, row_[r].head, row_[r].query_row), dim_, r,
                      kItemRows, pairs);
    }
  }

  template <class Fn>
  void with_output_row(Index r, Fn&& fn) const {
    const MutableTensorView& out = r_.weights;
    with_float_type(out.dtype, [&](auto tag) {
      fn(row_of<decltype(tag)>(out, seg_->batch, row_[r].out_head, row_[r].out_row));
    });
  }

  // Dense output: zeros for the keys outside the tiles [tile_lo, hi) and outside the
  // row's sequence, which the tiles never write.
  void zero_outside(Index tile_lo, Index hi) const {
    const Index total = r_.weights.shape[3];
    for (Index r = 0; r < rows_; ++r) {
      with_output_row(r, [&](auto* out) {
        using T = std::remove_pointer_t<decltype(out)>;
        std::fill(out, out + seg_->k_begin + tile_lo, T{});
        std::fill(out + seg_->k_begin + hi, out + total, T{});
      });
    }
  }

  void sweep_tile(Index tile, Index tile_end, Pass pass) {
    if (bf16_dot_ || fp16_parts_) {
      compute_scores_paired(tile, tile_end);
    } else {
      compute_scores(tile, tile_end);
    }
    for (Index r = 0; r < rows_; ++r) {
      if (row_[r].by_dot) compute_scores_by_dot(r, tile, tile_end);
    }
    for (Index r = 0; r < rows_; ++r) {
      if (pass == Pass::statistics) {
        row_statistics(r, tile, tile_end);
      } else {
        row_emit(r, tile, tile_end);
      }
    }
  }

  // The tile's scores of the rows the forward kernel scores by bf16 dot products or fp16
  // parts: its kernel (scores_rows_bf16 on K's bf16 rows, scores_rows_fp16 on the keys' parts)
  // for the keys some row sees, S^T transposed into the rows.
  void compute_scores_paired([[maybe_unused]] Index tile, [[maybe_unused]] Index tile_end) {
#if HWY_ARCH_X86
    Index first = tile_end, end = tile;
    for (Index r = 0; r < rows_; ++r) {
      if (row_[r].by_dot) continue;
      const Index a = std::max(row_[r].first, tile), b = std::min(row_[r].end, tile_end);
      if (a >= b) continue;
      first = std::min(first, a);
      end = std::max(end, b);
    }
    if (first >= end) return;
    constexpr Index kRowsPerCall = 3 * kBf16RowsPerVector;  // 1 to 3 vectors a call
    const auto scale = static_cast<float>(p_.scale);
    for (Index r = 0; r < rows_; r += kRowsPerCall) {
      const Index rows = std::min(kRowsPerCall, rows_ - r);
      const int vectors = static_cast<int>((rows + kBf16RowsPerVector - 1) / kBf16RowsPerVector);
      if (fp16_parts_) {
        const Index key = seg_->k_begin + first;
        scores_rows_fp16(s_.query_pairs.get() + r * 2, s_.rows_finite.get() + r, kItemRows,
                         key_parts_.parts_of(seg_->batch, kv_head_, key),
                         key_parts_.finite_of(seg_->batch, kv_head_, key), end - first, dim_, scale,
                         vectors, s_.scores_t.get() + r);
      } else {
        scores_rows_bf16(
            s_.query_pairs.get() + r * 2, kItemRows,
            &row_of<bfloat16>(p_.k, seg_->batch, kv_head_, seg_->k_begin + first)->bits,
            p_.k.strides[2], end - first, dim_, scale, vectors, s_.scores_t.get() + r);
      }
    }
    for (Index r = 0; r < rows_; ++r) {
      if (row_[r].by_dot) continue;
      float* row = s_.scores.get() + r * kKeyTile - tile;
      for (Index j = first; j < end; ++j) row[j] = s_.scores_t[(j - first) * kItemRows + r];
    }
#endif
  }

  // The tile's scores of the rows forward scores by the FMA chain over d (keys-vectorised).
  void compute_scores(Index tile, Index tile_end) {
    tile_keys_ = keys_.at(seg_->batch, kv_head_, p_.heads_kv, dim_) + seg_->k_begin + tile;
    // Key vectors [first, end) of the tile that some row of each block sees; rows that
    // forward scores by dot products are scored below instead.
    Index first[kItemRows / kScoreRows], end[kItemRows / kScoreRows];
    for (Index block = 0; block < rows_padded_; block += kScoreRows) {
      Index a_min = tile_end, b_max = tile;
      for (Index r = block; r < std::min(block + kScoreRows, rows_); ++r) {
        const Index a = std::max(row_[r].first, tile), b = std::min(row_[r].end, tile_end);
        if (a >= b || row_[r].by_dot) continue;
        a_min = std::min(a_min, a);
        b_max = std::max(b_max, b);
      }
      first[block / kScoreRows] = a_min < b_max ? (a_min - tile) / lanes_ : 0;
      end[block / kScoreRows] = a_min < b_max ? (b_max - tile + lanes_ - 1) / lanes_ : 0;
    }
    // Key groups outside, row blocks inside, so that a group's K^T (12 KB at D = 64) stays
    // in L1 for every block of the item, where the whole tile's would not (32 KB).
    constexpr Index kGroup = Traits::kScoreVectors;
    const Index vectors = (tile_end - tile + lanes_ - 1) / lanes_;
    for (Index v = 0; v < vectors; v += kGroup) {
      for (Index block = 0; block < rows_padded_; block += kScoreRows) {
        const Index a = std::max(v, first[block / kScoreRows]);
        const Index b = std::min(v + kGroup, end[block / kScoreRows]);
        if (a < b) compute_block_scores(block, a, b);
      }
    }
  }

  // Scores of the kScoreRows rows from `block` for key vectors [first, end) of the tile,
  // at most kScoreVectors of them.
  void compute_block_scores(Index block, Index first, Index end) {
    const float* q = s_.queries.get() + block * dim_;
    const Index at = first * lanes_, stride = keys_.stride;
    float* out = s_.scores.get() + block * kKeyTile + at;
    const float* kt = tile_keys_ + at;
    constexpr int kWidest = Traits::kScoreVectors;
    if (end - first == 1) {
      return tile::scores_keys_vectorised<kScoreRows, 1>(q, dim_, kt, stride, dim_, out, kKeyTile);
    }
    if (end - first == 2) {
      return tile::scores_keys_vectorised<kScoreRows, 2>(q, dim_, kt, stride, dim_, out, kKeyTile);
    }
    tile::scores_keys_vectorised<kScoreRows, kWidest>(q, dim_, kt, stride, dim_, out, kKeyTile);
  }

  // Row r's scores of the keys it sees in [tile, tile_end) by the dot micro-kernel on K's
  // own rows, for a row the forward kernel scores that way.
  void compute_scores_by_dot(Index r, Index tile, Index tile_end) {
    constexpr Index kKeys = tile::kDotKeys<1>;
    const Index first = std::max(row_[r].first, tile), end = std::min(row_[r].end, tile_end);
    const float* q[1] = {s_.queries.get() + r * dim_};
    float* scores = s_.scores.get() + r * kKeyTile - tile;
    with_float_type(p_.k.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        for (Index j = first; j < end; j += kKeys) {
          const Index keys = std::min(kKeys, end - j);
          const T* k[kKeys];
          for (Index i = 0; i < kKeys; ++i) {
            k[i] =
                row_of<T>(p_.k, seg_->batch, kv_head_, seg_->k_begin + j + std::min(i, keys - 1));
          }
          float dots[kKeys];
          float* out[1] = {dots};
          tile::scores_by_dot<T, 1>(q, k, dim_, out);
          std::copy(dots, dots + keys, scores + j);
        }
      }
    });
  }

  // The shaper of the tile core, lanes being keys: softcap, ALiBi, keys outside [first, end)
  // (the row's range within the tile), then the mask. Returns the vectors [first, end) of
  // the tile that cover them.
  std::pair<Index, Index> shape_scores(Index r, Index tile, Index first, Index end) {
    const DF df;
    const DI di;
    const Row& row = row_[r];
    float* s = s_.scores.get() + r * kKeyTile;
    const Index v_first = (first - tile) / lanes_, v_end = (end - tile + lanes_ - 1) / lanes_;
    const auto first_key = hn::Set(di, static_cast<std::int32_t>(first));
    const auto end_key = hn::Set(di, static_cast<std::int32_t>(end));
    const auto position = hn::Set(di, static_cast<std::int32_t>(row.position));
    const VF slope = hn::Set(df, row.slope);
    // Without softcap and ALiBi only the two edge vectors may hold keys to hide.
    const bool edges_only = !shaping_.softcap && !shaping_.alibi;
    for (Index v = v_first; v < v_end; ++v) {
      if (edges_only && v != v_first && v + 1 != v_end) v = v_end - 1;
      float* at = s + v * lanes_;
      const auto key =
          hn::Add(hn::Iota(di, 0), hn::Set(di, static_cast<std::int32_t>(tile + v * lanes_)));
      hn::Store(tile::shape_scores<true>(shaping_, hn::Load(df, at), key, position, slope,
                                         first_key, end_key),
                df, at);
    }
    if (p_.mask_kind != MaskKind::none) apply_mask(r, tile, first, end);
    return {v_first, v_end};
  }

  void apply_mask(Index r, Index tile, Index first, Index end) {
    float* s = s_.scores.get() + r * kKeyTile - tile;
    with_element_type(p_.mask.dtype, [&](auto tag) {
      using M = decltype(tag);
      const M* mask =
          row_of<M>(p_.mask, seg_->batch, row_[r].head, row_[r].query_row) + seg_->k_begin;
      tile::mask_scores(mask, first, end, s + first, 1);
    });
  }

  // The state merge with the row's scores of this tile; top-k offers them to the heap.
  void row_statistics(Index r, Index tile, Index tile_end) {
    Row& row = row_[r];
    const Index first = std::max(row.first, tile), end = std::min(row.end, tile_end);
    if (first >= end) return;
    const auto [v_first, v_end] = shape_scores(r, tile, first, end);
    float* s = s_.scores.get() + r * kKeyTile + v_first * lanes_;
    tile::online_softmax_keys<false>(s, v_end - v_first, row.row_max, row.row_sum);
    if (top_k_) offer(r, tile, v_first, v_end);
  }

  // The tile's scores offered to the row's top-k heap in key order; whole vectors below
  // its threshold are passed over.
  void offer(Index r, Index tile, Index v_first, Index v_end) {
    const DF df;
    TopK& best = row_[r].best;
    const float* s = s_.scores.get() + r * kKeyTile;
    for (Index v = v_first; v < v_end; ++v) {
      if (hn::AllFalse(df, hn::Gt(hn::Load(df, s + v * lanes_), hn::Set(df, best.threshold())))) {
        continue;
      }
      for (Index lane = 0; lane < lanes_; ++lane) {
        best.offer(s[v * lanes_ + lane], tile + v * lanes_ + lane);
      }
    }
  }

  // shift and factor of each row, from its own statistics or from the forward kernel's
  // lse (weight_scale_of_lse).
  void normalise() {
    for (Index r = 0; r < rows_; ++r) {
      Row& row = row_[r];
      if (r_.lse && !top_k_) {
        row.scale =
            weight_scale_of_lse(row_of<double>(*r_.lse, seg_->batch, row.head, row.query_row)[0]);
      } else {
        const RowEnd<double> end = end_of_row(static_cast<double>(row.row_max), row.row_sum);
        row.scale = {end.inverse_l == 0.0 ? 0.0f : row.row_max, static_cast<float>(end.inverse_l)};
      }
    }
  }

  // weights[key] = exp(s - shift) * factor for the tile's keys (tile::weights_of_scores);
  // 0 for hidden keys. Straight into an f32 output; other dtypes through a tile buffer.
  void row_emit(Index r, Index tile, Index tile_end) {
    const Row& row = row_[r];
    const Index keys = tile_end - tile;
    float* buffer = s_.out_row.get();
    float* direct = nullptr;
    if (r_.weights.dtype == DType::f32) {
      with_output_row(r, [&](auto* out) {
        if constexpr (std::is_same_v<std::remove_pointer_t<decltype(out)>, float>) {
          direct = out + seg_->k_begin + tile;
        }
      });
    }
    float* weights = direct != nullptr ? direct : buffer;
    const Index first = std::max(row.first, tile), end = std::min(row.end, tile_end);
    if (first >= end) {
      std::fill(weights, weights + keys, 0.0f);
    } else {
      const auto [v_first, v_end] = shape_scores(r, tile, first, end);
      const Index from = v_first * lanes_, to = std::min(v_end * lanes_, keys);
      std::fill(weights, weights + from, 0.0f);
      tile::weights_of_scores(s_.scores.get() + r * kKeyTile + from, to - from, row.scale,
                              weights + from);
      std::fill(weights + to, weights + keys, 0.0f);
    }
    if (direct == nullptr) {
      with_output_row(r, [&](auto* out) { from_floats(buffer, keys, out + seg_->k_begin + tile); });
    }
  }

  // The heap, best first, as weights and key indices; padding past the keys the row saw.
  void write_top_k(Index r) {
    const DF df;
    Row& row = row_[r];
    const Candidate* heap = row.best.sorted();
    float* weights = s_.out_row.get();
    const Index count = row.best.size(), padded = round_up(count, lanes_);
    for (Index t = 0; t < count; ++t) weights[t] = heap[t].score;
    std::fill(weights + count, weights + padded, 0.0f);
    const VF shift = hn::Set(df, row.scale.shift), factor = hn::Set(df, row.scale.factor);
    for (Index t = 0; t < padded; t += lanes_) {
      const VF x = hn::Load(df, weights + t);
      hn::Store(hn::Mul(tile::softmax_weight(df, x, shift), factor), df, weights + t);
    }
    const Index k = r_.weights.shape[3];
    with_output_row(r, [&](auto* out) {
      using T = std::remove_pointer_t<decltype(out)>;
      from_floats(weights, count, out);
      std::fill(out + count, out + k, T{});
    });
    const Index at =
        ((seg_->batch * r_.weights.shape[1] + row.out_head) * r_.weights.shape[2] + row.out_row) *
        k;
    for (Index t = 0; t < k; ++t) r_.indices[at + t] = t < count ? seg_->k_begin + heap[t].key : -1;
  }

  const Problem& p_;
  const WeightRequest& r_;
  const std::vector<WeightRow>& list_;
  const KeysTransposed& keys_;
  const KeyParts& key_parts_;
  const Index heap_capacity_;
  Scratch& s_;
  const tile::ScoreShaping shaping_{p_.softcap, !p_.alibi_slopes.empty()};
  const bool top_k_ = r_.top_k.has_value();
  const Index lanes_ = tile::lanes();
  const bool forward_widens_ = forward_widens_tiles(p_.k.dtype, p_.v.dtype);
  const bool bf16_dot_;    // scores as forward's bf16 dot products (compute_scores_paired)
  const bool fp16_parts_;  // scores as forward's fp16 parts on AMX (compute_scores_paired)
  const Index dim_ = p_.dim_qk;
  const Segment* seg_ = nullptr;
  const float* tile_keys_ = nullptr;  // K^T at the current tile's first key
  Index kv_head_ = 0, rows_ = 0, rows_padded_ = 0;
  Row row_[kItemRows];
};

}  // namespace

void WeightsTarget(const Problem& p, const WeightRequest& request, int threads) {
  const std::vector<WeightRow> rows = core::weight_rows(p, request);
  const Index group = p.group_size();
  std::vector<WorkItem> items;
  for (Index i = 0; i < static_cast<Index>(rows.size());) {
    const WeightRow& lead = rows[static_cast<std::size_t>(i)];
    Index j = i + 1;
    while (j < static_cast<Index>(rows.size()) && j - i < kItemRows &&
           rows[static_cast<std::size_t>(j)].segment == lead.segment &&
           rows[static_cast<std::size_t>(j)].head / group == lead.head / group) {
      ++j;
    }
    items.push_back({i, j - i});
    i = j;
  }
  if (items.empty()) return;
  // Rows never see more than total_k keys, so a larger k needs no larger heap.
  const Index heap_capacity = request.top_k ? std::min(*request.top_k, p.total_k) : 0;
  // Scores by bf16 dot products read K's rows in place, fp16 parts K's parts (KeyParts): no
  // transposed copy.
  const bool bf16_dot = scores_by_bf16_dot(p, tile::kAvx512Target);
  const bool fp16_parts = scores_by_fp16_parts(p, tile::kAvx512Target);
  const KeysTransposed keys(p, threads, !bf16_dot && !fp16_parts);
  const KeyParts key_parts(p, threads);
  threads = tile::threads_for(static_cast<Index>(items.size()), threads);
  std::vector<Scratch> scratch;
  scratch.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    scratch.emplace_back(p.dim_qk, heap_capacity, bf16_dot, fp16_parts);
  }
  tile::run_items(static_cast<Index>(items.size()), threads, [&](int thread) {
    return [&, kernel = ItemKernel(p, request, rows, keys, key_parts, heap_capacity, bf16_dot,
                                   fp16_parts, scratch[static_cast<std::size_t>(thread)])](
               Index i) mutable { kernel.run(items[static_cast<std::size_t>(i)]); };
  });
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(WeightsTarget);

void weights(const core::Problem& problem, const core::WeightRequest& request) {
  HWY_DYNAMIC_DISPATCH(WeightsTarget)(problem, request, resolve_threads(problem.threads));
}

}  // namespace attn::cpu
#endif
