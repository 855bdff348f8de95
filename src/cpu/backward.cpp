// The fast backward kernel (FlashAttention-2's backward), on the pieces of cpu/tile-inl.h.
// With P = exp(S - lse) recomputed from the forward's lse, D = rowsum(dO * O) and
// dS = P (dP - D) times the softcap's derivative:
//   pass 1, dK and dV: work items are (segment, KV head, block of keys), keys across lanes.
//     Every query row of the group's heads that sees the block streams past it in a fixed
//     order: S = Q K^T and dP = dO V^T (keys-vectorised), shaping, P, dS, then
//     dV += P^T dO and dK += dS^T Q (row-broadcast products into the block's rows).
//   pass 2, dQ: work items are (segment, query head, block of rows), rows across lanes.
//     Every visible key tile: S^T = K Q^T and dP^T = V dO^T (rows-vectorised), shaping, P,
//     dS, then dQ += dS K.
// Each gradient row is summed by exactly one work item in a fixed order, so there are no
// atomics and any thread count gives the same bits. Keys hidden from a row have P = 0 and
// dS = 0 (selected, never 0 * NaN), and a key tile holding NaN or infinity adds to dQ only
// where dS is not 0. Extra memory: D and lse as floats (O(L) per head), per thread O((rows
// + keys) x d) floats; never L x L.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attn/half.hpp"
#include "core/backward_problem.hpp"
#include "core/element_type.hpp"
#include "core/mask.hpp"
#include "core/rows.hpp"
#include "core/visible_keys.hpp"
#include "cpu/backward.hpp"
#include "cpu/backward_traits.hpp"
#include "cpu/head_dim.hpp"
#include "cpu/threads.hpp"

#include "cpu/tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace {

using core::BackwardProblem;
using core::from_float;
using core::MaskKind;
using core::Problem;
using core::round_up;
using core::row_of;
using core::Segment;
using core::with_element_type;
using core::with_float_type;
using tile::DF;
using tile::DI;
using tile::scratch_buffer;
using tile::VF;
using Traits = BackwardTraits;
namespace hn = hwy::HWY_NAMESPACE;
using Buffer = hwy::AlignedFreeUniquePtr<float[]>;
using IntBuffer = hwy::AlignedFreeUniquePtr<std::int32_t[]>;

// Per (batch, query head, query row): the forward's lse as a shift (tile::lse_shift) and
// D = dO . O, both float.
struct RowStatistics {
  std::vector<float> shift, d;
  Index heads = 0, rows = 0;
  Index at(Index b, Index h, Index row) const { return (b * heads + h) * rows + row; }
};

// D, the shifts, and dsinks (-sum over rows of P_sink D, in float64 in a fixed order).
RowStatistics row_statistics(const BackwardProblem& bp) {
  const Problem& p = bp.forward;
  RowStatistics stats;
  stats.heads = p.heads_q;
  stats.rows = p.total_q;
  const auto size = static_cast<std::size_t>(p.batch * p.heads_q * p.total_q);
  stats.shift.assign(size, 0.0f);
  stats.d.assign(size, 0.0f);
  std::vector<double> out(p.dim_v), dout(p.dim_v), dsinks(p.heads_q, 0.0);
  for (Index b = 0; b < p.batch; ++b)
    for (Index h = 0; h < p.heads_q; ++h)
      for (Index row = 0; row < p.total_q; ++row) {
        core::load_row(bp.out, b, h, row, out.data());
        core::load_row(bp.dout, b, h, row, dout.data());
        double d = 0.0;
        for (Index c = 0; c < p.dim_v; ++c) d += out[c] * dout[c];
        const double lse = core::load_element(bp.lse, b, h, row, 0);
        const std::size_t i = static_cast<std::size_t>(stats.at(b, h, row));
        stats.d[i] = static_cast<float>(d);
        stats.shift[i] = tile::lse_shift(static_cast<float>(lse));
        if (!p.sinks.empty() && lse != -INFINITY) {
          dsinks[h] -= std::exp(static_cast<double>(p.sinks[h]) - lse) * d;
        }
      }
  if (bp.dsinks) {
    for (Index h = 0; h < p.heads_q; ++h) core::store_row(*bp.dsinks, 0, h, 0, &dsinks[h]);
  }
  return stats;
}

// One row of a gradient, acc * factor, written in the gradient's dtype.
void store_gradient(const MutableTensorView& t, Index b, Index h, Index s, const float* acc,
                    Index width, float factor) {
  with_float_type(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* row = row_of<T>(t, b, h, s);
    for (Index d = 0; d < width; ++d) row[d] = from_float<T>(acc[d] * factor);
  });
}

// o[r][:] += sum_{j < count} a[j * a_stride + r] b[j][:] for `rows` rows of o, by the tile
// core's rows-vectorised context micro-kernel with a rescale of 1: kContextRows rows by up
// to kContextVectors vectors of columns. o rows are `width` floats (whole vectors).
void accumulate(const float* a, Index a_stride, const float* b, Index b_stride, Index count,
                Index rows, const float* ones, float* o, Index width) {
  const Index n = tile::lanes(), vectors = width / n;
  constexpr int kRows = Traits::kContextRows;
  constexpr Index kWidest = Traits::kContextVectors;
  Index r = 0;
  auto columns = [&](auto rows_tag) {
    constexpr int R = decltype(rows_tag)::value;
    for (Index v = 0; v < vectors;) {
      const Index left = vectors - v;
      // A remainder of 1 after the widest blocks becomes 2 + 2 (as forward's context pass).
      const Index w = left == kWidest + 1 && kWidest > 2 ? kWidest - 1 : std::min(left, kWidest);
      const float* bb = b + v * n;
      float* oo = o + r * width + v * n;
      if (w == 1) {
        tile::context_rows_vectorised<1, R>(a + r, a_stride, bb, b_stride, count, ones, oo, width);
      } else if (w == 2) {
        tile::context_rows_vectorised<2, R>(a + r, a_stride, bb, b_stride, count, ones, oo, width);
      } else {
        tile::context_rows_vectorised<3, R>(a + r, a_stride, bb, b_stride, count, ones, oo, width);
      }
      v += w;
    }
  };
  for (; r + kRows <= rows; r += kRows) columns(std::integral_constant<int, kRows>{});
  for (; r < rows; ++r) columns(std::integral_constant<int, 1>{});
}

// The shaped score's weight and dS for one vector: P = exp(s - shift) and
// dS = P (dP - D) d score / d x, exactly 0 where P is 0 (a hidden key's dP may be NaN).
HWY_INLINE void weights_and_ds(DF df, float* HWY_RESTRICT s, float* HWY_RESTRICT dp,
                               const float* HWY_RESTRICT slope, VF shift, VF d) {
  const VF p = tile::softmax_weight(df, hn::Load(df, s), shift);
  VF ds = hn::Mul(p, hn::Sub(hn::Load(df, dp), d));
  if (slope != nullptr) ds = hn::Mul(ds, hn::Load(df, slope));
  hn::Store(p, df, s);
  hn::Store(hn::IfThenZeroElse(hn::Eq(p, hn::Zero(df)), ds), df, dp);
}

template <class M>
const M* mask_row(const Problem& p, const Segment& seg, Index head, Index i) {
  return row_of<M>(p.mask, seg.batch, head, seg.q_begin + i) + seg.k_begin;
}

// ---- Pass 1: dK and dV by key blocks ------------------------------------------------------

struct KeyBlockScratch {
  KeyBlockScratch(Index keys, Index dim_p, Index dim_vp)
      : kt(scratch_buffer<float>(dim_p * keys)),
        vt(scratch_buffer<float>(dim_vp * keys)),
        row(scratch_buffer<float>(std::max(dim_p, dim_vp))),
        q(scratch_buffer<float>(Traits::kQueryTile * dim_p)),
        dout(scratch_buffer<float>(Traits::kQueryTile * dim_vp)),
        s(scratch_buffer<float>(Traits::kQueryTile * keys)),
        dp(scratch_buffer<float>(Traits::kQueryTile * keys)),
        slope(scratch_buffer<float>(Traits::kQueryTile * keys)),
        dk(scratch_buffer<float>(keys * dim_p)),
        dv(scratch_buffer<float>(keys * dim_vp)),
        ones(scratch_buffer<float>(std::max<Index>(keys, Traits::kContextRows))) {
    std::fill(ones.get(), ones.get() + std::max<Index>(keys, Traits::kContextRows), 1.0f);
  }
  Buffer kt, vt;   // [dim_p][keys], [dim_vp][keys]: the block's K^T and V^T, zero-padded
  Buffer row;      // one input row in f32
  Buffer q, dout;  // [kQueryTile][dim_p]: scale * q;  [kQueryTile][dim_vp]: dO
  Buffer s, dp;    // [kQueryTile][keys]: S then P;  dP then dS
  Buffer slope;    // [kQueryTile][keys]: d score / d x (softcap only)
  Buffer dk, dv;   // [keys][dim_p], [keys][dim_vp]: the block's sums
  Buffer ones;     // the context micro-kernel's rescale, 1
};

template <int kDim>
class KeyBlockKernel {
 public:
  KeyBlockKernel(const BackwardProblem& bp, const RowStatistics& stats, KeyBlockScratch& scratch)
      : bp_(bp), p_(bp.forward), stats_(stats), s_(scratch) {}

  // The block [first, first + keys_) of segment seg's keys for one KV head.
  void run(const Segment& seg, Index kv_head, Index first) {
    seg_ = &seg;
    kv_head_ = kv_head;
    first_ = first;
    end_ = std::min(first + block_, seg.len_k);
    pack_keys();
    std::fill(s_.dk.get(), s_.dk.get() + block_ * dim_p_, 0.0f);
    std::fill(s_.dv.get(), s_.dv.get() + block_ * dim_vp_, 0.0f);
    const Index group = p_.group_size();
    for (Index g = 0; g < group; ++g) {
      head_ = kv_head * group + g;
      for (Index i = 0; i < seg.len_q; i += Traits::kQueryTile) {
        query_tile(i, std::min<Index>(Traits::kQueryTile, seg.len_q - i));
      }
    }
    for (Index j = first_; j < end_; ++j) {
      const Index key = seg.k_begin + j;
      store_gradient(bp_.dk, seg.batch, kv_head, key, s_.dk.get() + (j - first_) * dim_p_, dim_,
                     1.0f);
      store_gradient(bp_.dv, seg.batch, kv_head, key, s_.dv.get() + (j - first_) * dim_vp_, dim_v_,
                     1.0f);
    }
  }

 private:
  // K^T and V^T of the block in f32, zero past the block's keys and past d.
  void pack_keys() {
    std::fill(s_.kt.get(), s_.kt.get() + dim_p_ * block_, 0.0f);
    std::fill(s_.vt.get(), s_.vt.get() + dim_vp_ * block_, 0.0f);
    for (Index j = first_; j < end_; ++j) {
      const Index key = seg_->k_begin + j, col = j - first_;
      load_row(p_.k, key, dim_);
      for (Index d = 0; d < dim_; ++d) s_.kt[d * block_ + col] = s_.row[d];
      load_row(p_.v, key, dim_v_);
      for (Index d = 0; d < dim_v_; ++d) s_.vt[d * block_ + col] = s_.row[d];
    }
  }

  void load_row(const TensorView& x, Index key, Index width) {
    with_float_type(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        to_floats(row_of<T>(x, seg_->batch, kv_head_, key), width, s_.row.get());
      }
    });
  }

  // Query rows [i0, i0 + rows) of head_ against the block, when any of them sees it.
  void query_tile(Index i0, Index rows) {
    for (Index t = 0; t < rows; ++t) {
      const Index position = p_.query_position(*seg_, i0 + t);
      range_[t] = core::visible_keys(p_.causal, p_.window, position, seg_->len_k);
      range_[t].first = std::max(range_[t].first, first_);
      range_[t].end = std::min(range_[t].end, end_);
      position_[t] = position;
    }
    Index first_row = rows, end_row = 0;
    for (Index t = 0; t < rows; ++t) {
      if (range_[t].first >= range_[t].end) continue;
      first_row = std::min(first_row, t);
      end_row = t + 1;
    }
    if (first_row >= end_row) return;
    i0 += first_row;
    rows = end_row - first_row;
    if (first_row > 0) {
      std::copy(range_ + first_row, range_ + end_row, range_);
      std::copy(position_ + first_row, position_ + end_row, position_);
    }
    pack_rows(i0, rows);
    scores(rows);
    shape(i0, rows);
    const Index n = tile::lanes();
    for (Index t = 0; t < rows; ++t) {
      const std::size_t at =
          static_cast<std::size_t>(stats_.at(seg_->batch, head_, seg_->q_begin + i0 + t));
      const VF shift = hn::Set(df_, stats_.shift[at]), d = hn::Set(df_, stats_.d[at]);
      for (Index c = 0; c < block_; c += n) {
        const Index x = t * block_ + c;
        weights_and_ds(df_, s_.s.get() + x, s_.dp.get() + x,
                       shaping_.softcap ? s_.slope.get() + x : nullptr, shift, d);
      }
    }
    // dV += P^T dO and dK += dS^T (scale q): keys are the output rows, query rows the sum.
    accumulate(s_.s.get(), block_, s_.dout.get(), dim_vp_, rows, block_, s_.ones.get(), s_.dv.get(),
               dim_vp_);
    accumulate(s_.dp.get(), block_, s_.q.get(), dim_p_, rows, block_, s_.ones.get(), s_.dk.get(),
               dim_p_);
  }

  // scale * q and dO of the rows in f32, zero-padded to whole vectors.
  void pack_rows(Index i0, Index rows) {
    const auto scale = static_cast<float>(p_.scale);
    const Index b = seg_->batch;
    for (Index t = 0; t < rows; ++t) {
      const Index row = seg_->q_begin + i0 + t;
      float* q = s_.q.get() + t * dim_p_;
      float* dout = s_.dout.get() + t * dim_vp_;
      with_float_type(p_.q.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, double>) {
          tile::scaled_query(row_of<T>(p_.q, b, head_, row), dim_, scale, q);
        }
      });
      with_float_type(bp_.dout.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, double>) {
          to_floats(row_of<T>(bp_.dout, b, head_, row), dim_v_, dout);
        }
      });
      std::fill(q + dim_, q + dim_p_, 0.0f);
      std::fill(dout + dim_v_, dout + dim_vp_, 0.0f);
    }
  }

  // S = (scale q) K^T and dP = dO V^T, keys across lanes.
  void scores(Index rows) {
    constexpr Index R = Traits::kScoreRows;
    constexpr int C = Traits::kKeyVectors;
    Index t = 0;
    for (; t + R <= rows; t += R) {
      tile::scores_keys_vectorised<R, C>(s_.q.get() + t * dim_p_, s_.kt.get(), block_, dim_p_,
                                         s_.s.get() + t * block_, block_);
      tile::scores_keys_vectorised<R, C>(s_.dout.get() + t * dim_vp_, s_.vt.get(), block_, dim_vp_,
                                         s_.dp.get() + t * block_, block_);
    }
    for (; t < rows; ++t) {
      tile::scores_keys_vectorised<1, C>(s_.q.get() + t * dim_p_, s_.kt.get(), block_, dim_p_,
                                         s_.s.get() + t * block_, block_);
      tile::scores_keys_vectorised<1, C>(s_.dout.get() + t * dim_vp_, s_.vt.get(), block_, dim_vp_,
                                         s_.dp.get() + t * block_, block_);
    }
  }

  // The shared shaper (keys across lanes, one row broadcast), then the mask.
  void shape(Index i0, Index rows) {
    const DI di;
    const Index n = tile::lanes();
    for (Index t = 0; t < rows; ++t) {
      const auto position = hn::Set(di, static_cast<std::int32_t>(position_[t]));
      const auto first = hn::Set(di, static_cast<std::int32_t>(range_[t].first));
      const auto end = hn::Set(di, static_cast<std::int32_t>(range_[t].end));
      const VF slope = hn::Set(df_, p_.alibi_slopes.empty() ? 0.0f : p_.alibi_slopes[head_]);
      for (Index c = 0; c < block_; c += n) {
        const auto key = hn::Iota(di, static_cast<std::int32_t>(first_ + c));
        float* at = s_.s.get() + t * block_ + c;
        VF derivative = hn::Zero(df_);
        hn::Store(tile::shape_scores<true>(shaping_, hn::Load(df_, at), key, position, slope, first,
                                           end, &derivative),
                  df_, at);
        if (shaping_.softcap) hn::Store(derivative, df_, s_.slope.get() + t * block_ + c);
      }
    }
    if (p_.mask_kind == MaskKind::none) return;
    with_element_type(p_.mask.dtype, [&](auto tag) {
      using M = decltype(tag);
      for (Index t = 0; t < rows; ++t) {
        tile::mask_scores(mask_row<M>(p_, *seg_, head_, i0 + t), first_, end_,
                          s_.s.get() + t * block_, 1);
      }
    });
  }

  const BackwardProblem& bp_;
  const Problem& p_;
  const RowStatistics& stats_;
  KeyBlockScratch& s_;
  const DF df_;
  const tile::ScoreShaping shaping_{p_.softcap, !p_.alibi_slopes.empty()};
  const Index block_ = Traits::kKeyVectors * tile::lanes();
  const Index dim_ = kDim > 0 ? kDim : p_.dim_qk;
  const Index dim_v_ = kDim > 0 ? kDim : p_.dim_v;
  const Index dim_p_ = round_up(dim_, tile::lanes());
  const Index dim_vp_ = round_up(dim_v_, tile::lanes());
  const Segment* seg_ = nullptr;
  Index kv_head_ = 0, head_ = 0, first_ = 0, end_ = 0;
  core::KeyRange range_[Traits::kQueryTile];
  Index position_[Traits::kQueryTile] = {};
};

// ---- Pass 2: dQ by query blocks ------------------------------------------------------------

struct QueryBlockScratch {
  QueryBlockScratch(Index rows, Index dim, Index dim_v, Index dim_p)
      : qt(scratch_buffer<float>(dim * rows)),
        dout_t(scratch_buffer<float>(dim_v * rows)),
        s(scratch_buffer<float>(Traits::kKeyTile * rows)),
        dp(scratch_buffer<float>(Traits::kKeyTile * rows)),
        slope(scratch_buffer<float>(Traits::kKeyTile * rows)),
        dq(scratch_buffer<float>(rows * dim_p)),
        keys(scratch_buffer<float>(Traits::kKeyTile * dim_p)),
        values(scratch_buffer<float>(Traits::kKeyTile * dim_v)),
        row(scratch_buffer<float>(std::max(dim, dim_v))),
        shift(scratch_buffer<float>(rows)),
        d(scratch_buffer<float>(rows)),
        alibi(scratch_buffer<float>(rows)),
        ones(scratch_buffer<float>(std::max<Index>(Traits::kKeyTile, rows))),
        first(scratch_buffer<std::int32_t>(rows)),
        end(scratch_buffer<std::int32_t>(rows)),
        position(scratch_buffer<std::int32_t>(rows)) {
    std::fill(ones.get(), ones.get() + std::max<Index>(Traits::kKeyTile, rows), 1.0f);
  }
  Buffer qt, dout_t;       // [dim][rows], [dim_v][rows]: scale * q and dO, transposed
  Buffer s, dp, slope;     // [kKeyTile][rows]: S^T then P^T;  dP^T then dS^T;  d score / d x
  Buffer dq;               // [rows][dim_p]: dS K
  Buffer keys, values;     // [kKeyTile][dim_p], [kKeyTile][dim_v]: the tile in f32
  Buffer row;              // one input row in f32
  Buffer shift, d, alibi;  // [rows]
  Buffer ones;
  IntBuffer first, end, position;  // [rows]
};

template <int kDim>
class QueryBlockKernel {
 public:
  QueryBlockKernel(const BackwardProblem& bp, const RowStatistics& stats,
                   QueryBlockScratch& scratch)
      : bp_(bp), p_(bp.forward), stats_(stats), s_(scratch) {}

  void run(const Segment& seg, Index head, Index i0, Index rows) {
    seg_ = &seg;
    head_ = head;
    i0_ = i0;
    rows_ = rows;
    rows_p_ = round_up(rows, n_);
    set_up_rows();
    std::fill(s_.dq.get(), s_.dq.get() + rows_p_ * dim_p_, 0.0f);
    Index first = seg.len_k, end = 0;
    for (Index r = 0; r < rows_; ++r) {
      if (s_.first[r] >= s_.end[r] || s_.shift[r] == INFINITY) continue;
      first = std::min<Index>(first, s_.first[r]);
      end = std::max<Index>(end, s_.end[r]);
    }
    for (Index t = first; t < end; t += Traits::kKeyTile) {
      key_tile(t, std::min<Index>(t + Traits::kKeyTile, end));
    }
    const auto scale = static_cast<float>(p_.scale);
    for (Index r = 0; r < rows_; ++r) {
      store_gradient(bp_.dq, seg.batch, head, seg.q_begin + i0 + r, s_.dq.get() + r * dim_p_, dim_,
                     scale);
    }
  }

 private:
  void set_up_rows() {
    const Index b = seg_->batch;
    const auto scale = static_cast<float>(p_.scale);
    float* q = s_.row.get();
    for (Index r = 0; r < rows_p_; ++r) {
      const bool real = r < rows_;
      const Index i = i0_ + (real ? r : 0), row = seg_->q_begin + i;
      const Index position = p_.query_position(*seg_, i);
      const core::KeyRange keys = core::visible_keys(p_.causal, p_.window, position, seg_->len_k);
      const std::size_t at = static_cast<std::size_t>(stats_.at(b, head_, row));
      s_.first[r] = static_cast<std::int32_t>(keys.first);
      s_.end[r] = static_cast<std::int32_t>(real ? keys.end : keys.first);
      s_.position[r] = static_cast<std::int32_t>(position);
      s_.shift[r] = real ? stats_.shift[at] : INFINITY;
      s_.d[r] = real ? stats_.d[at] : 0.0f;
      s_.alibi[r] = p_.alibi_slopes.empty() ? 0.0f : p_.alibi_slopes[head_];
      with_float_type(p_.q.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, double>) {
          tile::scaled_query(row_of<T>(p_.q, b, head_, row), dim_, scale, q);
        }
      });
      for (Index d = 0; d < dim_; ++d) s_.qt[d * rows_p_ + r] = real ? q[d] : 0.0f;
      with_float_type(bp_.dout.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, double>) {
          to_floats(row_of<T>(bp_.dout, b, head_, row), dim_v_, q);
        }
      });
      for (Index d = 0; d < dim_v_; ++d) s_.dout_t[d * rows_p_ + r] = real ? q[d] : 0.0f;
    }
  }

  void key_tile(Index t0, Index t1) {
    const Index keys = t1 - t0, key0 = seg_->k_begin + t0;
    const FloatRows k =
        rows_as_floats(p_.k, seg_->batch, kv_head(), key0, keys, dim_, dim_p_, s_.keys.get());
    const FloatRows v =
        rows_as_floats(p_.v, seg_->batch, kv_head(), key0, keys, dim_v_, dim_v_, s_.values.get());
    scores(k, v, keys);
    shape(t0, t1);
    for (Index c = 0; c < rows_p_; c += n_) {
      const VF shift = hn::Load(df_, s_.shift.get() + c), d = hn::Load(df_, s_.d.get() + c);
      for (Index j = 0; j < keys; ++j) {
        const Index x = j * rows_p_ + c;
        weights_and_ds(df_, s_.s.get() + x, s_.dp.get() + x,
                       shaping_.softcap ? s_.slope.get() + x : nullptr, shift, d);
      }
    }
    // dQ += dS K; a K row with NaN or infinity goes row by row, past the zeros of dS.
    if (tile::rows_finite(k.rows, keys, k.stride, dim_)) {
      accumulate(s_.dp.get(), rows_p_, k.rows, k.stride, keys, rows_, s_.ones.get(), s_.dq.get(),
                 dim_p_);
    } else {
      for (Index r = 0; r < rows_; ++r) {
        tile::context_skipping_zero_weights(s_.dp.get() + r, rows_p_, k.rows, k.stride, keys, 1.0f,
                                            s_.dq.get() + r * dim_p_, dim_p_);
      }
    }
  }

  Index kv_head() const { return head_ / p_.group_size(); }

  // S^T = K (scale q)^T and dP^T = V dO^T, rows across lanes.
  void scores(const FloatRows& k, const FloatRows& v, Index keys) {
    const Index vectors = rows_p_ / n_;
    for (Index c = 0; c < vectors; c += Traits::kRowVectors) {
      const Index width = std::min<Index>(Traits::kRowVectors, vectors - c);
      if (width == 1) {
        scores<1>(k, v, keys, c * n_);
      } else if (width == 2) {
        scores<2>(k, v, keys, c * n_);
      } else {
        scores<Traits::kRowVectors>(k, v, keys, c * n_);
      }
    }
  }

  template <int C>
  void scores(const FloatRows& k, const FloatRows& v, Index keys, Index row) {
    constexpr int K = Traits::kScoreKeys;
    Index j = 0;
    for (; j + K <= keys; j += K) {
      const float* key_rows[K];
      const float* value_rows[K];
      for (int i = 0; i < K; ++i) {
        key_rows[i] = k.rows + (j + i) * k.stride;
        value_rows[i] = v.rows + (j + i) * v.stride;
      }
      tile::scores_rows_vectorised<kDim, C, K>(s_.qt.get() + row, rows_p_, key_rows, dim_,
                                               s_.s.get() + j * rows_p_ + row);
      tile::scores_rows_vectorised<kDim, C, K>(s_.dout_t.get() + row, rows_p_, value_rows, dim_v_,
                                               s_.dp.get() + j * rows_p_ + row);
    }
    for (; j < keys; ++j) {
      const float* key_rows[1] = {k.rows + j * k.stride};
      const float* value_rows[1] = {v.rows + j * v.stride};
      tile::scores_rows_vectorised<kDim, C, 1>(s_.qt.get() + row, rows_p_, key_rows, dim_,
                                               s_.s.get() + j * rows_p_ + row);
      tile::scores_rows_vectorised<kDim, C, 1>(s_.dout_t.get() + row, rows_p_, value_rows, dim_v_,
                                               s_.dp.get() + j * rows_p_ + row);
    }
  }

  // The shared shaper (rows across lanes, one key broadcast), then the mask.
  void shape(Index t0, Index t1) {
    const DI di;
    for (Index c = 0; c < rows_p_; c += n_) {
      const auto first = hn::Load(di, s_.first.get() + c);
      const auto end = hn::Load(di, s_.end.get() + c);
      const auto position = hn::Load(di, s_.position.get() + c);
      const VF slope = hn::Load(df_, s_.alibi.get() + c);
      for (Index j = t0; j < t1; ++j) {
        const Index x = (j - t0) * rows_p_ + c;
        const auto key = hn::Set(di, static_cast<std::int32_t>(j));
        VF derivative = hn::Zero(df_);
        hn::Store(tile::shape_scores<true>(shaping_, hn::Load(df_, s_.s.get() + x), key, position,
                                           slope, first, end, &derivative),
                  df_, s_.s.get() + x);
        if (shaping_.softcap) hn::Store(derivative, df_, s_.slope.get() + x);
      }
    }
    if (p_.mask_kind == MaskKind::none) return;
    with_element_type(p_.mask.dtype, [&](auto tag) {
      using M = decltype(tag);
      for (Index r = 0; r < rows_; ++r) {
        tile::mask_scores(mask_row<M>(p_, *seg_, head_, i0_ + r), t0, t1, s_.s.get() + r, rows_p_);
      }
    });
  }

  const BackwardProblem& bp_;
  const Problem& p_;
  const RowStatistics& stats_;
  QueryBlockScratch& s_;
  const DF df_;
  const Index n_ = tile::lanes();
  const tile::ScoreShaping shaping_{p_.softcap, !p_.alibi_slopes.empty()};
  const Index dim_ = kDim > 0 ? kDim : p_.dim_qk;
  const Index dim_v_ = kDim > 0 ? kDim : p_.dim_v;
  const Index dim_p_ = round_up(dim_, tile::lanes());
  const Segment* seg_ = nullptr;
  Index head_ = 0, i0_ = 0, rows_ = 0, rows_p_ = 0;
};

template <int kDim>
void run_kernel(const BackwardProblem& bp, int threads) {
  const Problem& p = bp.forward;
  const RowStatistics stats = row_statistics(bp);
  const Index n = tile::lanes();
  const Index dim_p = round_up(p.dim_qk, n), dim_vp = round_up(p.dim_v, n);

  struct KeyItem {
    Index segment, kv_head, first;
  };
  std::vector<KeyItem> key_items;
  const Index block = Traits::kKeyVectors * n;
  for (std::size_t s = 0; s < p.segments.size(); ++s)
    for (Index h = 0; h < p.heads_kv; ++h)
      for (Index j = 0; j < p.segments[s].len_k; j += block)
        key_items.push_back({static_cast<Index>(s), h, j});
  // Keys no query row sees still get their zero gradient from the block that holds them.
  if (!key_items.empty()) {
    const int t = tile::threads_for(static_cast<Index>(key_items.size()), threads);
    std::vector<KeyBlockScratch> scratch;
    scratch.reserve(static_cast<std::size_t>(t));
    for (int i = 0; i < t; ++i) scratch.emplace_back(block, dim_p, dim_vp);
    tile::run_items(static_cast<Index>(key_items.size()), t, [&](int thread) {
      return [&, kernel = KeyBlockKernel<kDim>(
                     bp, stats, scratch[static_cast<std::size_t>(thread)])](Index i) mutable {
        const KeyItem& item = key_items[static_cast<std::size_t>(i)];
        kernel.run(p.segments[static_cast<std::size_t>(item.segment)], item.kv_head, item.first);
      };
    });
  }

  struct QueryItem {
    Index segment, head, first, rows;
  };
  std::vector<QueryItem> query_items;
  const Index rows = Traits::kRowVectors * n;
  for (std::size_t s = 0; s < p.segments.size(); ++s)
    for (Index h = 0; h < p.heads_q; ++h)
      for (Index i = 0; i < p.segments[s].len_q; i += rows)
        query_items.push_back(
            {static_cast<Index>(s), h, i, std::min(rows, p.segments[s].len_q - i)});
  if (query_items.empty()) return;
  const int t = tile::threads_for(static_cast<Index>(query_items.size()), threads);
  std::vector<QueryBlockScratch> scratch;
  scratch.reserve(static_cast<std::size_t>(t));
  for (int i = 0; i < t; ++i) scratch.emplace_back(rows, p.dim_qk, p.dim_v, dim_p);
  tile::run_items(static_cast<Index>(query_items.size()), t, [&](int thread) {
    return [&, kernel = QueryBlockKernel<kDim>(
                   bp, stats, scratch[static_cast<std::size_t>(thread)])](Index i) mutable {
      const QueryItem& item = query_items[static_cast<std::size_t>(i)];
      kernel.run(p.segments[static_cast<std::size_t>(item.segment)], item.head, item.first,
                 item.rows);
    };
  });
}

}  // namespace

void BackwardTarget(const BackwardProblem& problem, int threads) {
  with_head_dim(problem.forward.dim_qk, problem.forward.dim_v,
                [&](auto dim) { run_kernel<decltype(dim)::value>(problem, threads); });
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(BackwardTarget);

std::string backward_unsupported(const core::BackwardProblem& problem) {
  const core::Problem& p = problem.forward;
  for (const TensorView* input : {&p.q, &p.k, &p.v, &problem.out, &problem.dout}) {
    if (input->dtype == DType::f64) return "float64 inputs (it computes in float32)";
  }
  constexpr Index kMaxRows = Index{1} << 30;  // key positions and distances fit in int32
  if (p.total_q >= kMaxRows || p.total_k >= kMaxRows) return "sequences of 2^30 rows or more";
  return {};
}

void backward(const core::BackwardProblem& problem) {
  HWY_DYNAMIC_DISPATCH(BackwardTarget)(problem, resolve_threads(problem.forward.threads));
}

}  // namespace attn::cpu
#endif
