// The fast backward kernel (FlashAttention-2's backward), on the pieces of cpu/tile/.
// With P = exp(S - lse) recomputed from the forward's lse, D = rowsum(dO * O) and
// dS = P (dP - D) times the softcap's derivative, one pass over blocks of keys, keys across
// lanes: every query row of the KV head's group that sees a block streams past it (heads
// and rows in a fixed order): S = Q K^T and dP = dO V^T (keys-vectorised), shaping, P, dS,
// then dV += P^T dO and dK += dS^T Q into the block's rows, and dQ += dS K into the
// work item's own partial dQ (the context micro-kernel each time).
// Work items are (segment, KV head, part): the part deals the key blocks round-robin to a
// fixed number of items (by shape, never by thread count), each with its own partial dQ,
// summed in part order at the end. So every sum has a fixed order, there are no atomics,
// and any thread count gives the same bits. Keys hidden from a row have P = 0 and dS = 0
// (selected, never 0 * NaN), and a key block holding NaN or infinity adds to dQ only where
// dS is not 0. With dropout (the factor z: 0, or 1 / (1 - p) where forward kept the weight;
// cpu/tile/dropout-inl.h), dP = z dO V^T, dV takes P z and D = dO . O is of the dropped
// output, as forward made it. Extra memory: D and lse (O(L) per head), the partial dQs (parts x L x
// d per head, float32) and per-thread tiles; never L x L.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/backward/backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "attn/half.hpp"
#include "cache/huge_pages.hpp"
#include "core/backward_problem.hpp"
#include "core/block_masking.hpp"
#include "core/element_type.hpp"
#include "core/mask.hpp"
#include "core/position_bias.hpp"
#include "core/rows.hpp"
#include "core/visible_keys.hpp"
#include "cpu/backward/backward.hpp"
#include "cpu/backward/traits.hpp"
#include "cpu/head_dim.hpp"
#include "cpu/threads.hpp"

#include "cpu/tile/context_kernels-inl.h"
#include "cpu/tile/dropout-inl.h"
#include "cpu/tile/run-inl.h"
#include "cpu/tile/score_kernels-inl.h"
#include "cpu/tile/shaping-inl.h"
#include "cpu/tile/softmax-inl.h"
#include "cpu/tile/target-inl.h"

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
// 32 vector registers (AVX-512, and Arm's NEON and SVE) hold BackwardTraits' wide blocks.
constexpr bool kWideRegisters = tile::kVectorRegisters == 32;
constexpr int kKeyVectors =
    kWideRegisters ? BackwardTraits::kKeyVectorsWide : BackwardTraits::kKeyVectors;
namespace hn = hwy::HWY_NAMESPACE;
using Buffer = hwy::AlignedFreeUniquePtr<float[]>;

// Per (batch, query head, query row): the forward's lse as a shift (tile::lse_shift) and
// D = dO . O, both float.
struct RowStatistics {
  std::vector<float> shift, d;
  Index heads = 0, rows = 0;
  Index at(Index b, Index h, Index row) const { return (b * heads + h) * rows + row; }
};

// D, the shifts, and dsinks (-sum over rows of P_sink D, in float64: per (batch, head)
// over rows in order, then over batch entries in order, so on any thread count).
RowStatistics row_statistics(const BackwardProblem& bp, int threads) {
  const Problem& p = bp.forward;
  RowStatistics stats;
  stats.heads = p.heads_q;
  stats.rows = p.total_q;
  const auto size = static_cast<std::size_t>(p.batch * p.heads_q * p.total_q);
  stats.shift.assign(size, 0.0f);
  stats.d.assign(size, 0.0f);
  std::vector<double> dsinks(static_cast<std::size_t>(p.batch * p.heads_q), 0.0);
  const Index items = p.batch * p.heads_q;
  tile::run_items(items, tile::threads_for(items, threads), [&](int) {
    return [&, out = std::vector<double>(p.dim_v),
            dout = std::vector<double>(p.dim_v)](Index item) mutable {
      const Index b = item / p.heads_q, h = item % p.heads_q;
      double dsink = 0.0;
      for (Index row = 0; row < p.total_q; ++row) {
        core::load_row(bp.out, b, h, row, out.data());
        core::load_row(bp.dout, b, h, row, dout.data());
        // D by the chain over the value dim that makes dP = dO . v_j (in order, by the
        // target's MulAdd, as scores_keys_vectorised): a row whose weight rests on one key
        // (out = v_j) then gets dS = P (dP - D) = 0 exactly, as in exact arithmetic, where a
        // float64 D left dP's float32 rounding as its gradient.
        float d = 0.0f;
        for (Index c = 0; c < p.dim_v; ++c) {
          d = tile::lane_mul_add(static_cast<float>(dout[c]), static_cast<float>(out[c]), d);
        }
        const double lse = core::load_element(bp.lse, b, h, row, 0);
        const std::size_t i = static_cast<std::size_t>(stats.at(b, h, row));
        stats.d[i] = d;
        stats.shift[i] = tile::lse_shift(static_cast<float>(lse));
        if (!p.sinks.empty() && lse != -INFINITY) {
          // dsinks meets no dP, so its D is summed in float64.
          double d64 = 0.0;
          for (Index c = 0; c < p.dim_v; ++c) d64 += out[c] * dout[c];
          dsink -= std::exp(static_cast<double>(p.sinks[h]) - lse) * d64;
        }
      }
      dsinks[static_cast<std::size_t>(item)] = dsink;
    };
  });
  if (bp.dsinks) {
    for (Index h = 0; h < p.heads_q; ++h) {
      double sum = 0.0;
      for (Index b = 0; b < p.batch; ++b)
        sum += dsinks[static_cast<std::size_t>(b * p.heads_q + h)];
      core::store_row(*bp.dsinks, 0, h, 0, &sum);
    }
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

// o[r][:] += sum_{j < count} a[j * a_key_stride + r * a_row_stride] b[j][:] for `rows` rows
// of o, by the tile core's rows-vectorised context micro-kernel: kContextRows(Wide) rows by
// up to kContextVectors(Wide) vectors of columns. o rows are `width` floats (whole vectors).
void accumulate(const float* a, Index a_key_stride, Index a_row_stride, const float* b,
                Index b_stride, Index count, Index rows, float* o, Index width) {
  const Index n = tile::lanes(), vectors = width / n;
  constexpr int kRows = kWideRegisters ? Traits::kContextRowsWide : Traits::kContextRows;
  constexpr Index kWidest = kWideRegisters ? Traits::kContextVectorsWide : Traits::kContextVectors;
  Index r = 0;
  auto columns = [&](auto rows_tag) {
    constexpr int R = decltype(rows_tag)::value;
    const float* aa = a + r * a_row_stride;
    const Index ks = a_key_stride, rs = a_row_stride;
    for (Index v = 0; v < vectors;) {
      const Index w = tile::context_block_width(vectors - v, kWidest);
      const float* bb = b + v * n;
      float* oo = o + r * width + v * n;
      if (w == 1) {
        tile::context_rows_vectorised<1, R>(aa, ks, rs, bb, b_stride, count, nullptr, oo, width);
      } else if (w == 2) {
        tile::context_rows_vectorised<2, R>(aa, ks, rs, bb, b_stride, count, nullptr, oo, width);
      } else if (w == 3) {
        tile::context_rows_vectorised<3, R>(aa, ks, rs, bb, b_stride, count, nullptr, oo, width);
      } else {
        tile::context_rows_vectorised<4, R>(aa, ks, rs, bb, b_stride, count, nullptr, oo, width);
      }
      v += w;
    }
  };
  for (; r + kRows <= rows; r += kRows) columns(std::integral_constant<int, kRows>{});
  for (; r + 2 <= rows; r += 2) columns(std::integral_constant<int, 2>{});
  for (; r < rows; ++r) columns(std::integral_constant<int, 1>{});
}

// The shaped score's weight and dS for one vector: P = exp(s - shift) and
// dS = P (z dP - D) d score / d x, exactly 0 where P is 0 (a hidden key's dP may be NaN);
// s becomes P z, the weight dV takes. z: dropout's factor (1 without dropout: exact).
// bias_sums (the position bias's sums by offset, or null) gains P (z dP - D), the gradient
// of the score itself.
HWY_INLINE void weights_and_ds(DF df, float* HWY_RESTRICT s, float* HWY_RESTRICT dp,
                               const float* HWY_RESTRICT slope, VF shift, VF d, VF z,
                               float* HWY_RESTRICT bias_sums) {
  const VF p = tile::softmax_weight(df, hn::Load(df, s), shift);
  const auto hidden = hn::Eq(p, hn::Zero(df));
  VF ds = hn::Mul(p, hn::Sub(hn::Mul(z, hn::Load(df, dp)), d));
  if (bias_sums != nullptr) {
    hn::StoreU(hn::Add(hn::LoadU(df, bias_sums), hn::IfThenZeroElse(hidden, ds)), df, bias_sums);
  }
  if (slope != nullptr) ds = hn::Mul(ds, hn::Load(df, slope));
  hn::Store(hn::Mul(p, z), df, s);
  hn::Store(hn::IfThenZeroElse(hidden, ds), df, dp);
}

template <class M>
const M* mask_row(const Problem& p, const Segment& seg, Index head, Index i) {
  return row_of<M>(p.mask, seg.batch, head, seg.q_begin + i) + seg.k_begin;
}

// ---- The pass over key blocks ----------------------------------------------------------

struct KeyBlockScratch {
  KeyBlockScratch(Index keys, Index dim_p, Index dim_vp, Index bias_sums_size)
      : bias_sums(static_cast<std::size_t>(bias_sums_size)),
        kt(scratch_buffer<float>(dim_p * keys)),
        vt(scratch_buffer<float>(dim_vp * keys)),
        row(scratch_buffer<float>(std::max(dim_p, dim_vp))),
        q(scratch_buffer<float>(Traits::kQueryTile * dim_p)),
        dout(scratch_buffer<float>(Traits::kQueryTile * dim_vp)),
        s(scratch_buffer<float>(Traits::kQueryTile * keys)),
        dp(scratch_buffer<float>(Traits::kQueryTile * keys)),
        slope(scratch_buffer<float>(Traits::kQueryTile * keys)),
        k_rows(scratch_buffer<float>(keys * dim_p)),
        dk(scratch_buffer<float>(keys * dim_p)),
        dv(scratch_buffer<float>(keys * dim_vp)) {}
  // [group][bias stride]: an item's dS sums by offset key - position (position bias)
  std::vector<float> bias_sums;
  Buffer kt, vt;   // [dim_p][keys], [dim_vp][keys]: the block's K^T and V^T, zero-padded
  Buffer row;      // one input row in f32
  Buffer q, dout;  // [kQueryTile][dim_p]: scale * q;  [kQueryTile][dim_vp]: dO when converted
  Buffer s, dp;    // [kQueryTile][keys]: S then P;  dP then dS
  Buffer slope;    // [kQueryTile][keys]: d score / d x (softcap only)
  Buffer k_rows;   // [keys][dim_p]: the block's K rows in f32, zero-padded
  Buffer dk, dv;   // [keys][dim_p], [keys][dim_vp]: the block's sums
};

template <int kDim>
class KeyBlockKernel {
 public:
  KeyBlockKernel(const BackwardProblem& bp, const RowStatistics& stats, KeyBlockScratch& scratch,
                 float* dq_parts, Index part_size, Index bias_stride)
      : bp_(bp),
        p_(bp.forward),
        stats_(stats),
        s_(scratch),
        dq_parts_(dq_parts),
        part_size_(part_size),
        bias_stride_(bias_stride) {}

  // The key blocks part, part + parts, ... of segment seg's keys for one KV head. With a
  // position bias, bias_columns [group][columns] gains this item's gradient of each query
  // head's table row.
  void run(const Segment& seg, Index kv_head, Index part, Index parts, double* bias_columns) {
    seg_ = &seg;
    kv_head_ = kv_head;
    bias_sums_ = bias_columns != nullptr ? s_.bias_sums.data() : nullptr;
    if (bias_sums_ != nullptr) {
      std::fill(s_.bias_sums.begin(), s_.bias_sums.end(), 0.0f);
      bias_first_ = seg.len_q > 0 ? -p_.query_position(seg, seg.len_q - 1) : 0;
    }
    dq_ = dq_parts_ + part * part_size_;
    // This item's rows of its partial dQ, zeroed here: the segments cover every row, so the
    // items together zero every part, in parallel, each row first touched by its summer.
    const Index group = p_.group_size();
    for (Index g = 0; g < group; ++g) {
      float* rows =
          dq_ +
          (p_.total_q * (seg.batch * p_.heads_q + kv_head * group + g) + seg.q_begin) * dim_p_;
      std::fill(rows, rows + seg.len_q * dim_p_, 0.0f);
    }
    for (Index first = part * block_; first < seg.len_k; first += parts * block_) {
      key_block(first);
    }
    if (bias_sums_ == nullptr) return;
    for (Index g = 0; g < group; ++g) {
      core::add_by_column(*p_.rule.position_bias, bias_sums_ + g * bias_stride_, bias_first_,
                          seg.len_q + seg.len_k - 1,
                          bias_columns + g * p_.rule.position_bias->columns);
    }
  }

 private:
  // The block [first, first + block_) of the segment's keys.
  void key_block(Index first) {
    const Segment& seg = *seg_;
    const Index kv_head = kv_head_;
    first_ = first;
    end_ = std::min(first + block_, seg.len_k);
    pack_keys();
    keys_finite_ = tile::rows_finite(s_.k_rows.get(), block_, dim_p_, dim_);
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

  // K^T, V^T and K rows of the block in f32, zero past the block's keys and past d.
  void pack_keys() {
    std::fill(s_.kt.get(), s_.kt.get() + dim_p_ * block_, 0.0f);
    std::fill(s_.vt.get(), s_.vt.get() + dim_vp_ * block_, 0.0f);
    std::fill(s_.k_rows.get(), s_.k_rows.get() + block_ * dim_p_, 0.0f);
    for (Index j = first_; j < end_; ++j) {
      const Index key = seg_->k_begin + j, col = j - first_;
      const float* k = key_row(p_.k, key, dim_);
      for (Index d = 0; d < dim_; ++d) s_.kt[d * block_ + col] = k[d];
      std::copy(k, k + dim_, s_.k_rows.get() + col * dim_p_);
      const float* v = key_row(p_.v, key, dim_v_);
      for (Index d = 0; d < dim_v_; ++d) s_.vt[d * block_ + col] = v[d];
    }
  }

  // Row `key` of x[batch][kv head] in f32: x's own row, or converted into s_.row.
  const float* key_row(const TensorView& x, Index key, Index width) {
    return rows_as_floats(x, seg_->batch, kv_head_, key, 1, width, width, RowDistance::any,
                          s_.row.get())
        .rows;
  }

  // Query rows [i0, i0 + rows) of head_ against the block, when any of them sees it.
  void query_tile(Index i0, Index rows) {
    for (Index t = 0; t < rows; ++t) {
      const Index position = p_.query_position(*seg_, i0 + t);
      range_[t] = p_.rule.visible_keys(position, seg_->len_k);
      range_[t].first = std::max(range_[t].first, first_);
      range_[t].end = std::min(range_[t].end, end_);
      position_[t] = position;
      if (p_.mask_kind == MaskKind::blocks &&
          !core::blocks_show_any(*p_.block_mask, seg_->sequence, head_, i0 + t, range_[t].first,
                                 range_[t].end)) {
        range_[t].end = range_[t].first;
      }
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
    const tile::DU du;
    const tile::VU lanes = hn::Iota(du, 0);
    for (Index t = 0; t < rows; ++t) {
      const Index row = seg_->q_begin + i0 + t;
      const std::size_t at = static_cast<std::size_t>(stats_.at(seg_->batch, head_, row));
      const VF shift = hn::Set(df_, stats_.shift[at]), d = hn::Set(df_, stats_.d[at]);
      // The row's dropout bits, computed only with dropout.
      const core::DropoutRow drop =
          p_.dropout.on() ? core::dropout_row(p_.dropout.seed, seg_->batch, head_, row)
                          : core::DropoutRow{};
      const tile::VU low = hn::Set(du, drop.low), high = hn::Set(du, drop.high);
      // The row's sums by offset, at this block's first key.
      float* bias_sums = bias_sums_ == nullptr
                             ? nullptr
                             : bias_sums_ + (head_ - kv_head_ * p_.group_size()) * bias_stride_ +
                                   first_ - position_[t] - bias_first_;
      for (Index c = 0; c < block_; c += n) {
        const Index x = t * block_ + c;
        const auto key = static_cast<std::uint32_t>(seg_->k_begin + first_ + c);
        const VF z = p_.dropout.on() ? tile::dropout_factor(
                                           low, high, hn::Add(lanes, hn::Set(du, key)), p_.dropout)
                                     : hn::Set(df_, 1.0f);
        weights_and_ds(df_, s_.s.get() + x, s_.dp.get() + x,
                       shaping_.softcap ? s_.slope.get() + x : nullptr, shift, d, z,
                       bias_sums == nullptr ? nullptr : bias_sums + c);
      }
    }
    // dV += P^T dO and dK += dS^T (scale q): keys are the output rows, query rows the sum.
    accumulate(s_.s.get(), block_, 1, dout_.rows, dout_.stride, rows, block_, s_.dv.get(), dim_vp_);
    accumulate(s_.dp.get(), block_, 1, s_.q.get(), dim_p_, rows, block_, s_.dk.get(), dim_p_);
    accumulate_dq(i0, rows);
  }

  // dQ += dS K (unscaled: the scale is applied once, when the parts are summed), dS read
  // in place (query rows are the micro-kernel's output rows). A block whose K holds NaN or
  // infinity goes row by row, past the zeros of dS.
  void accumulate_dq(Index i0, Index rows) {
    float* dq =
        dq_ + (p_.total_q * (seg_->batch * p_.heads_q + head_) + seg_->q_begin + i0) * dim_p_;
    if (keys_finite_) {
      accumulate(s_.dp.get(), 1, block_, s_.k_rows.get(), dim_p_, block_, rows, dq, dim_p_);
      return;
    }
    for (Index t = 0; t < rows; ++t) {
      tile::context_skipping_zero_weights(s_.dp.get() + t * block_, 1, s_.k_rows.get(), dim_p_,
                                          block_, 1.0f, dq + t * dim_p_, dim_p_);
    }
  }

  // scale * q of the rows in f32 and dO's rows as f32, zero-padded to whole vectors: dO is
  // read in place where it is f32 of whole vectors (rows_as_floats), since every key
  // block reads every query tile again.
  void pack_rows(Index i0, Index rows) {
    const auto scale = static_cast<float>(p_.rule.scale);
    const Index b = seg_->batch, first = seg_->q_begin + i0;
    for (Index t = 0; t < rows; ++t) {
      float* q = s_.q.get() + t * dim_p_;
      with_float_type(p_.q.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, double>) {
          tile::scaled_query(row_of<T>(p_.q, b, head_, first + t), dim_, scale, q);
        }
      });
      std::fill(q + dim_, q + dim_p_, 0.0f);
    }
    dout_ = rows_as_floats(bp_.dout, b, head_, first, rows, dim_v_, dim_vp_, RowDistance::any,
                           s_.dout.get());
  }

  // S = (scale q) K^T and dP = dO V^T, keys across lanes.
  void scores(Index rows) {
    constexpr int R = kWideRegisters ? Traits::kScoreRowsWide : Traits::kScoreRows;
    constexpr int C = kKeyVectors;
    const float *q = s_.q.get(), *dout = dout_.rows;
    const Index dout_stride = dout_.stride;
    Index t = 0;
    for (; t + R <= rows; t += R) {
      tile::scores_keys_vectorised<R, C>(q + t * dim_p_, dim_p_, s_.kt.get(), block_, dim_p_,
                                         s_.s.get() + t * block_, block_);
      tile::scores_keys_vectorised<R, C>(dout + t * dout_stride, dout_stride, s_.vt.get(), block_,
                                         dim_vp_, s_.dp.get() + t * block_, block_);
    }
    for (; t < rows; ++t) {
      tile::scores_keys_vectorised<1, C>(q + t * dim_p_, dim_p_, s_.kt.get(), block_, dim_p_,
                                         s_.s.get() + t * block_, block_);
      tile::scores_keys_vectorised<1, C>(dout + t * dout_stride, dout_stride, s_.vt.get(), block_,
                                         dim_vp_, s_.dp.get() + t * block_, block_);
    }
  }

  // The shared shaper (keys across lanes, one row broadcast), then the mask.
  void shape(Index i0, Index rows) {
    const DI di;
    const Index n = tile::lanes();
    // Iota once: GCC builds each Iota through the stack, and the reload stalls (6% of time).
    const auto lanes = hn::Iota(di, 0);
    for (Index t = 0; t < rows; ++t) {
      const auto position = hn::Set(di, static_cast<std::int32_t>(position_[t]));
      const auto first = hn::Set(di, static_cast<std::int32_t>(range_[t].first));
      const auto end = hn::Set(di, static_cast<std::int32_t>(range_[t].end));
      const VF slope =
          hn::Set(df_, p_.rule.alibi_slopes.empty() ? 0.0f : p_.rule.alibi_slopes[head_]);
      const auto bias_start =
          hn::Set(di, static_cast<std::int32_t>(p_.bias_by_offset.start(head_)));
      for (Index c = 0; c < block_; c += n) {
        const auto key = hn::Add(lanes, hn::Set(di, static_cast<std::int32_t>(first_ + c)));
        float* at = s_.s.get() + t * block_ + c;
        VF derivative = hn::Zero(df_);
        hn::Store(tile::shape_scores<true>(shaping_, hn::Load(df_, at), key, position, slope,
                                           bias_start, first, end, &derivative),
                  df_, at);
        if (shaping_.softcap) hn::Store(derivative, df_, s_.slope.get() + t * block_ + c);
      }
    }
    if (p_.mask_kind == MaskKind::none) return;
    if (p_.mask_kind == MaskKind::blocks) {
      for (Index t = 0; t < rows; ++t) {
        core::hide_by_blocks(*p_.block_mask, seg_->sequence, head_, i0 + t, first_, end_,
                             s_.s.get() + t * block_, 1);
      }
      return;
    }
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
  float* const dq_parts_;
  const Index part_size_;
  const Index bias_stride_;  // of s_.bias_sums: a segment's offsets, and a block more
  const DF df_;
  const tile::ScoreShaping shaping_{p_.rule.softcap, !p_.rule.alibi_slopes.empty(),
                                    p_.bias_by_offset};
  const Index block_ = kKeyVectors * tile::lanes();
  const Index dim_ = kDim > 0 ? kDim : p_.dim_qk;
  const Index dim_v_ = kDim > 0 ? kDim : p_.dim_v;
  const Index dim_p_ = round_up(dim_, tile::lanes());
  const Index dim_vp_ = round_up(dim_v_, tile::lanes());
  const Segment* seg_ = nullptr;
  float* dq_ = nullptr;         // this item's partial dQ: [B][Hq][total_q][dim_p]
  FloatRows dout_{nullptr, 0};  // the query tile's dO rows as f32
  bool keys_finite_ = true;
  Index kv_head_ = 0, head_ = 0, first_ = 0, end_ = 0;
  float* bias_sums_ = nullptr;  // s_.bias_sums with a position bias, else null
  Index bias_first_ = 0;        // the offset key - position of bias_sums_[0]: the segment's least
  core::KeyRange range_[Traits::kQueryTile];
  Index position_[Traits::kQueryTile] = {};
};

// The table's gradient: per table row, the items' sums of the heads it serves, in item
// order (an item covers one KV head's group of query heads).
template <class Item>
void store_bias_gradient(const BackwardProblem& bp, const std::vector<Item>& items,
                         const std::vector<double>& bias_columns) {
  const Problem& p = bp.forward;
  const PositionBias& bias = *p.rule.position_bias;
  const Index columns = bias.columns, group = p.group_size();
  const bool shared = static_cast<Index>(bias.table.size()) == columns;
  std::vector<double> table(bias.table.size(), 0.0);
  for (std::size_t i = 0; i < items.size(); ++i) {
    for (Index g = 0; g < group; ++g) {
      const Index head = items[i].kv_head * group + g;
      double* row = table.data() + (shared ? 0 : head) * columns;
      const double* add = bias_columns.data() + (static_cast<Index>(i) * group + g) * columns;
      for (Index c = 0; c < columns; ++c) row[c] += add[c];
    }
  }
  for (Index h = 0; h * columns < static_cast<Index>(table.size()); ++h) {
    core::store_row(*bp.dposition_bias, 0, h, 0, table.data() + h * columns);
  }
}

struct HugePagesFree {
  void operator()(float* p) const { cache::free_huge_pages(p); }
};

template <int kDim>
void run_kernel(const BackwardProblem& bp, int threads) {
  const Problem& p = bp.forward;
  const RowStatistics stats = row_statistics(bp, threads);
  const Index n = tile::lanes();
  const Index dim_p = round_up(p.dim_qk, n), dim_vp = round_up(p.dim_v, n);
  const Index parts = key_parts(static_cast<Index>(p.segments.size()) * p.heads_kv);
  const Index part_size = p.batch * p.heads_q * p.total_q * dim_p;
  // Huge pages: tens of MiB touched once per call would otherwise cost a page fault per
  // 4 KiB. Zeroed by the work items (KeyBlockKernel::run).
  const std::unique_ptr<float[], HugePagesFree> dq_parts(static_cast<float*>(
      cache::allocate_huge_pages(static_cast<std::size_t>(parts * part_size) * sizeof(float))));

  struct Item {
    Index segment, kv_head, part;
  };
  std::vector<Item> items;
  for (std::size_t s = 0; s < p.segments.size(); ++s)
    for (Index h = 0; h < p.heads_kv; ++h)
      for (Index part = 0; part < parts; ++part) items.push_back({static_cast<Index>(s), h, part});
  const Index block = kKeyVectors * n, group = p.group_size();
  // With a position bias: each item's gradient of its heads' table rows, summed in item
  // order at the end, as dQ's parts are.
  const Index columns = p.rule.position_bias ? p.rule.position_bias->columns : 0;
  std::vector<double> bias_columns(items.size() * static_cast<std::size_t>(group * columns));
  Index bias_stride = 0;
  if (columns > 0) {
    for (const Segment& seg : p.segments) {
      bias_stride = std::max(bias_stride, seg.len_q + seg.len_k - 1 + block);
    }
  }
  if (!items.empty()) {
    const int t = tile::threads_for(static_cast<Index>(items.size()), threads);
    std::vector<KeyBlockScratch> scratch;
    scratch.reserve(static_cast<std::size_t>(t));
    for (int i = 0; i < t; ++i) scratch.emplace_back(block, dim_p, dim_vp, group * bias_stride);
    tile::run_items(static_cast<Index>(items.size()), t, [&](int thread) {
      return [&, kernel = KeyBlockKernel<kDim>(bp, stats, scratch[static_cast<std::size_t>(thread)],
                                               dq_parts.get(), part_size,
                                               bias_stride)](Index i) mutable {
        const Item& item = items[static_cast<std::size_t>(i)];
        kernel.run(p.segments[static_cast<std::size_t>(item.segment)], item.kv_head, item.part,
                   parts, columns > 0 ? bias_columns.data() + i * group * columns : nullptr);
      };
    });
  }
  if (columns > 0) store_bias_gradient(bp, items, bias_columns);

  // dq = scale * the parts' sum, in part order, a (batch, head) per item.
  const auto scale = static_cast<float>(p.rule.scale);
  const Index heads = p.batch * p.heads_q;
  tile::run_items(heads, tile::threads_for(heads, threads), [&](int) {
    return [&, sum = std::vector<float>(static_cast<std::size_t>(dim_p))](Index item) mutable {
      const Index b = item / p.heads_q, h = item % p.heads_q;
      for (Index row = 0; row < p.total_q; ++row) {
        const Index at = (item * p.total_q + row) * dim_p;
        std::copy(dq_parts.get() + at, dq_parts.get() + at + dim_p, sum.begin());
        for (Index part = 1; part < parts; ++part) {
          const float* add = dq_parts.get() + part * part_size + at;
          for (Index d = 0; d < dim_p; ++d) sum[static_cast<std::size_t>(d)] += add[d];
        }
        store_gradient(bp.dq, b, h, row, sum.data(), p.dim_qk, scale);
      }
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

void backward(const core::BackwardProblem& problem) {
  HWY_DYNAMIC_DISPATCH(BackwardTarget)(problem, resolve_threads(problem.forward.threads));
}

}  // namespace attn::cpu
#endif
