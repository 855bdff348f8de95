// The online softmax, in both layouts (lanes are rows, or lanes are keys): a NaN-keeping
// max, one step rule, exp; and weights from scores once a row's lse is known.
#if defined(ATTN_CPU_TILE_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_SOFTMAX_INL_H_
#undef ATTN_CPU_TILE_SOFTMAX_INL_H_
#else
#define ATTN_CPU_TILE_SOFTMAX_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <limits>

#include "attn/tensor.hpp"
#include "cpu/tile/state.hpp"

#include "cpu/tile/target-inl.h"
#include "cpu/tile/vector_exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

// ---- The online softmax ----------------------------------------------------------------

// The lane-wise maximum of `start` and `count` score vectors load(0 .. count), NaN in a
// lane where any of them was: hn::Max may drop a NaN operand (x86 returns its second
// operand), so NaN lanes are tracked beside it.
template <class Load>
HWY_INLINE VF max_of_scores(DF df, VF start, Index count, const Load& load) {
  VF max = start;
  auto nan = hn::IsNaN(start);
  for (Index i = 0; i < count; ++i) {
    const VF scores = load(i);
    max = hn::Max(max, scores);
    nan = hn::Or(nan, hn::IsNaN(scores));
  }
  return hn::IfThenElse(nan, hn::Set(df, std::numeric_limits<float>::quiet_NaN()), max);
}

// The maximum over the lanes of max_of_scores's result: NaN if any lane is.
HWY_INLINE float max_of_lanes(DF df, VF max) {
  if (!hn::AllFalse(df, hn::IsNaN(max))) return std::numeric_limits<float>::quiet_NaN();
  return hn::GetLane(hn::MaxOfLanes(df, max));
}

// One online-softmax step per lane's row: from the old max and the new one (the old max
// merged with the tile's scores by max_of_scores), the shift subtracted before exp, and
// softmax_rescale's factor e^(m_old - m_new) that rescales the row's l and acc. Nothing
// visible yet: the shift is 0, so exp(-inf - 0) = 0, not NaN. A NaN max makes the shift,
// the factor and so l and acc NaN: the row reports NaN, never "no key" (the state merge's
// rule, per tile).
HWY_INLINE VF softmax_shift(DF df, VF new_max) {
  return hn::IfThenZeroElse(hn::Eq(new_max, hn::Set(df, kMinusInfinity)), new_max);
}

HWY_INLINE VF softmax_rescale(DF df, VF old_max, VF shift) {
  return VectorExp(df, hn::Sub(old_max, shift));
}

// The step for one row held as scalars: new max (old max merged with the tile's), shift
// and rescale.
struct RowStep {
  float max, shift, rescale;
};

HWY_INLINE RowStep softmax_step(float old_max, float tile_max) {
  const DF df;
  const float new_max = merged_max(old_max, tile_max);
  // The vector step gives exactly these (VectorExp(0) is 1): a short cut for small tiles.
  if (new_max == old_max && new_max != kMinusInfinity) return {new_max, new_max, 1.0f};
  const VF shift = softmax_shift(df, hn::Set(df, new_max));
  return {new_max, hn::GetLane(shift),
          hn::GetLane(softmax_rescale(df, hn::Set(df, old_max), shift))};
}

// The softmax weight of a shaped score: exp(s - shift).
HWY_INLINE VF softmax_weight(DF df, VF score, VF shift) {
  return VectorExp(df, hn::Sub(score, shift));
}

// The weight of a shaped score under its row's WeightScale: exp(s - shift) * factor, and
// exactly 0 for a hidden key (-inf), whatever the shift.
HWY_INLINE VF weight_of_score(DF df, VF score, VF shift, VF factor) {
  return hn::IfThenZeroElse(hn::Eq(score, hn::Set(df, kMinusInfinity)),
                            hn::Mul(softmax_weight(df, score, shift), factor));
}

// out[0 .. count) = the weights of one row's scores s[0 .. count) (weight_of_score), out
// being s or apart from it; neither needs alignment, and the last count % lanes go through
// a vector of scratch.
inline void weights_of_scores(const float* s, Index count, WeightScale scale, float* out) {
  const DF df;
  const Index n = lanes(), whole = count - count % n;
  const VF shift = hn::Set(df, scale.shift), factor = hn::Set(df, scale.factor);
  for (Index i = 0; i < whole; i += n) {
    hn::StoreU(weight_of_score(df, hn::LoadU(df, s + i), shift, factor), df, out + i);
  }
  if (whole == count) return;
  HWY_ALIGN float last[hn::MaxLanes(DF())];
  std::copy(s + whole, s + count, last);
  std::fill(last + (count - whole), last + n, 0.0f);
  hn::Store(weight_of_score(df, hn::Load(df, last), shift, factor), df, last);
  std::copy(last, last + (count - whole), out + whole);
}

// The backward pass's shift for a row: its weights are exp(s - lse) from the forward's lse
// (softmax_weight with this shift), not from a running max. A row that saw no key (lse =
// -inf) gets +inf, so every weight is exp(-inf) = 0 rather than NaN.
inline float lse_shift(float lse) {
  return lse == kMinusInfinity ? std::numeric_limits<float>::infinity() : lse;
}

// The online softmax over one vector of rows (lanes are rows) and keys [0, keys) of the
// tile, scores at p[j * stride]: the weights exp(s - shift) go to put, a pair of keys at a
// time (put(j, w_j, w_j+1), and put(j, w_j) for an odd last key); the rows' m and l
// (vectors at m, l) are updated, and the factor that rescales their acc is left at rescale.
// With kScale the scores are still to be multiplied by `scale` (> 0), as each is read: the
// bits of scaling them first, since rounding keeps order, so the largest product is the
// product of the largest score.
template <bool kScale, class Put>
HWY_INLINE void online_softmax_rows(const float* p, Index keys, Index stride, float scale,
                                    float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                                    float* HWY_RESTRICT rescale, const Put& put) {
  const DF df;
  const VF factor = hn::Set(df, scale);
  const auto score = [&](Index j) ATTN_INLINE_LAMBDA {
    const VF s = hn::Load(df, p + j * stride);
    return kScale ? hn::Mul(s, factor) : s;
  };
  const VF old_max = hn::Load(df, m);
  VF new_max;
  if constexpr (kScale) {
    const VF tile_max = hn::Mul(
        max_of_scores(df, hn::Set(df, kMinusInfinity), keys,
                      [&](Index j) ATTN_INLINE_LAMBDA { return hn::Load(df, p + j * stride); }),
        factor);
    new_max = max_of_scores(df, old_max, 1, [&](Index) ATTN_INLINE_LAMBDA { return tile_max; });
  } else {
    new_max = max_of_scores(df, old_max, keys, score);
  }
  const VF shift = softmax_shift(df, new_max);
  const VF rescale_rows = softmax_rescale(df, old_max, shift);
  VF sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  Index j = 0;
  for (; j + 2 <= keys; j += 2) {
    const VF p0 = softmax_weight(df, score(j), shift);
    const VF p1 = softmax_weight(df, score(j + 1), shift);
    put(j, p0, p1);
    sum0 = hn::Add(sum0, p0);
    sum1 = hn::Add(sum1, p1);
  }
  if (j < keys) {
    const VF p0 = softmax_weight(df, score(j), shift);
    put(j, p0);
    sum0 = hn::Add(sum0, p0);
  }
  hn::Store(hn::MulAdd(hn::Load(df, l), rescale_rows, hn::Add(sum0, sum1)), df, l);
  hn::Store(new_max, df, m);
  hn::Store(rescale_rows, df, rescale);
}

// online_softmax_rows on scores already scaled, or (deferred_scale > 0) still to be, the
// weights to put.
template <class Put>
HWY_INLINE void online_softmax_rows(const float* p, Index keys, Index stride, float* HWY_RESTRICT m,
                                    float* HWY_RESTRICT l, float* HWY_RESTRICT rescale,
                                    float deferred_scale, const Put& put) {
  if (deferred_scale > 0.0f) {
    return online_softmax_rows<true>(p, keys, stride, deferred_scale, m, l, rescale, put);
  }
  online_softmax_rows<false>(p, keys, stride, 1.0f, m, l, rescale, put);
}

// The weights in place of the scores (P overwrites S).
struct WeightsInPlace {
  float* p;
  Index stride;

  HWY_INLINE void operator()(Index j, VF even, VF odd) const {
    hn::Store(even, DF(), p + j * stride);
    hn::Store(odd, DF(), p + (j + 1) * stride);
  }
  HWY_INLINE void operator()(Index j, VF even) const { hn::Store(even, DF(), p + j * stride); }
};

HWY_INLINE void online_softmax_rows(float* HWY_RESTRICT p, Index keys, Index stride,
                                    float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                                    float* HWY_RESTRICT rescale, float deferred_scale = 0.0f) {
  online_softmax_rows(p, keys, stride, m, l, rescale, deferred_scale, WeightsInPlace{p, stride});
}

// What a step of the online softmax over one row's keys leaves for the row's acc: the
// factor that rescales it, and the tile's largest score (-inf: the tile gives the row no
// weight).
struct RowUpdate {
  float rescale, tile_max;
};

// The online softmax over one row's scores (lanes are keys), for NR rows at once: row r's
// `vectors` whole vectors at s[r], hidden and padding lanes already -inf. Updates the row's
// m and l (*m[r], *l[r]: float, or double for a sum that must stay exact over many tiles);
// with kStore the scores become the weights exp(s - shift) in place; the row's RowUpdate is
// left at update[r]. Each row takes the operations it takes alone, so its bits do not depend
// on the rows beside it; side by side, the rows' lane reductions overlap.
template <bool kStore, int NR, class Sum>
HWY_INLINE void online_softmax_keys(float* const* s, Index vectors, float* const* m, Sum* const* l,
                                    RowUpdate* update) {
  const DF df;
  const Index n = lanes();
  float tile_max[NR];
  RowStep step[NR];
  for_each_index<NR>([&](auto r) ATTN_INLINE_LAMBDA {
    tile_max[r] = max_of_lanes(
        df, max_of_scores(df, hn::Set(df, kMinusInfinity), vectors,
                          [&](Index v) ATTN_INLINE_LAMBDA { return hn::Load(df, s[r] + v * n); }));
  });
  for_each_index<NR>([&](auto r)
                         ATTN_INLINE_LAMBDA { step[r] = softmax_step(*m[r], tile_max[r]); });
  for_each_index<NR>([&](auto r) ATTN_INLINE_LAMBDA {
    float* HWY_RESTRICT row = s[r];
    const VF shift = hn::Set(df, step[r].shift);
    VF sum0 = hn::Zero(df), sum1 = hn::Zero(df);
    Index v = 0;
    for (; v + 2 <= vectors; v += 2) {
      const VF p0 = softmax_weight(df, hn::Load(df, row + v * n), shift);
      const VF p1 = softmax_weight(df, hn::Load(df, row + (v + 1) * n), shift);
      if constexpr (kStore) {
        hn::Store(p0, df, row + v * n);
        hn::Store(p1, df, row + (v + 1) * n);
      }
      sum0 = hn::Add(sum0, p0);
      sum1 = hn::Add(sum1, p1);
    }
    if (v < vectors) {
      const VF p0 = softmax_weight(df, hn::Load(df, row + v * n), shift);
      if constexpr (kStore) hn::Store(p0, df, row + v * n);
      sum0 = hn::Add(sum0, p0);
    }
    const float tile_sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
    *l[r] = std::fma(*l[r], static_cast<Sum>(step[r].rescale), static_cast<Sum>(tile_sum));
    *m[r] = step[r].max;
    update[r] = {step[r].rescale, tile_max[r]};
  });
}

// The same for one row.
template <bool kStore, class Sum>
HWY_INLINE RowUpdate online_softmax_keys(float* HWY_RESTRICT s, Index vectors, float& m, Sum& l) {
  float* const rows[1] = {s};
  float* const maxes[1] = {&m};
  Sum* const sums[1] = {&l};
  RowUpdate update;
  online_softmax_keys<kStore, 1>(rows, vectors, maxes, sums, &update);
  return update;
}

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
