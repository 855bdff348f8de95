// What turns q and k into a score, in float32, in one order for every kernel: the query
// rule (scale * q), then the shaper (int8 key scale, softcap, ALiBi, the position bias, the
// visible range, the mask).
#if defined(ATTN_CPU_TILE_SHAPING_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_SHAPING_INL_H_
#undef ATTN_CPU_TILE_SHAPING_INL_H_
#else
#define ATTN_CPU_TILE_SHAPING_INL_H_
#endif

#include <hwy/highway.h>

#include <type_traits>

#include "attn/tensor.hpp"
#include "core/mask.hpp"
#include "core/position_bias.hpp"

#include <hwy/contrib/math/math-inl.h>
#include "cpu/tile/target-inl.h"
#include "cpu/tile/to_floats-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

// ---- Queries and stored rows -----------------------------------------------------------

// out[0 .. dim) = scale * q in float32: q widened exactly, then one float multiply. Every
// kernel scales q this way, so equal inputs give equal scores.
template <class T>
void scaled_query(const T* HWY_RESTRICT q, Index dim, float scale, float* HWY_RESTRICT out) {
  if constexpr (std::is_same_v<T, float>) {
    for (Index d = 0; d < dim; ++d) out[d] = scale * q[d];  // one pass: no copy to widen
  } else {
    to_floats(q, dim, out);
    for (Index d = 0; d < dim; ++d) out[d] = scale * out[d];
  }
}

// ---- The score shaper ------------------------------------------------------------------

// What turns q.k into a score, beyond the scale already in q. Built once per problem.
// by_offset: the position bias (empty without one).
struct ScoreShaping {
  ScoreShaping(double softcap_value, bool has_alibi, const core::BiasByOffset& by_offset = {})
      : softcap(softcap_value > 0.0),
        alibi(has_alibi),
        cap(static_cast<float>(softcap_value)),
        inverse_cap(softcap ? static_cast<float>(1.0 / softcap_value) : 0.0f),
        bias(by_offset.values.empty() ? nullptr : by_offset.values.data()),
        bias_first(static_cast<std::int32_t>(by_offset.first)),
        bias_last(static_cast<std::int32_t>(by_offset.last())) {}

  bool softcap, alibi;
  float cap, inverse_cap;
  const float* bias;
  std::int32_t bias_first, bias_last;  // the offsets key - position that bias lays out
};

// One vector of scores, shaped in float32 in this order: the key scale (kDequantise: int8, fp8;
// with kOffset, x * key_scale + key_offset in one multiply-add: int8 with zero points, whose
// offset term is the key's offset times the sum of the query row), softcap (cap tanh(x * (1 /
// cap))), ALiBi (- slope |position - key|), the position bias (bias[bias_start + key -
// position], the offset clamped; bias_start is core::BiasByOffset::start of the lane's head),
// then -inf for keys outside [first, end) (kHide). Lanes are whatever the layout puts there:
// rows-vectorised kernels pass a broadcast key and per-row position, slope, bias start and
// range; keys-vectorised ones pass per-lane keys and a broadcast row. The backward pass passes
// `derivative`, which gets d score / d x (the softcap's 1 - tanh^2, from the same tanh; 1
// without softcap).
template <bool kDequantise, bool kHide, bool kOffset = false>
HWY_INLINE VF shape_scores(const ScoreShaping& shaping, VF x, VF key_scale, VF key_offset, VI key,
                           VI position, VF slope, VI bias_start, VI first, VI end,
                           VF* derivative = nullptr) {
  const DF df;
  if constexpr (kOffset) {
    x = hn::MulAdd(x, key_scale, key_offset);
  } else if constexpr (kDequantise) {
    x = hn::Mul(x, key_scale);
  }
  if (shaping.softcap) {
    const VF t = hn::Tanh(df, hn::Mul(x, hn::Set(df, shaping.inverse_cap)));
    x = hn::Mul(hn::Set(df, shaping.cap), t);
    if (derivative != nullptr) *derivative = hn::NegMulAdd(t, t, hn::Set(df, 1.0f));
  } else if (derivative != nullptr) {
    *derivative = hn::Set(df, 1.0f);
  }
  if (shaping.alibi) {
    const VF distance = hn::Abs(hn::ConvertTo(df, hn::Sub(position, key)));
    x = hn::NegMulAdd(slope, distance, x);
  }
  if (shaping.bias != nullptr) {
    const DI di;
    const VI offset = hn::Min(hn::Max(hn::Sub(key, position), hn::Set(di, shaping.bias_first)),
                              hn::Set(di, shaping.bias_last));
    x = hn::Add(x, hn::GatherIndex(df, shaping.bias, hn::Add(bias_start, offset)));
  }
  if constexpr (kHide) {
    const auto shown = hn::AndNot(hn::Lt(key, first), hn::Lt(key, end));
    x = hn::IfThenElse(hn::RebindMask(df, shown), x, hn::Set(df, kMinusInfinity));
  }
  return x;
}

// shape_scores for keys that need no int8 dequantisation.
template <bool kHide>
HWY_INLINE VF shape_scores(const ScoreShaping& shaping, VF x, VI key, VI position, VF slope,
                           VI bias_start, VI first, VI end, VF* derivative = nullptr) {
  return shape_scores<false, kHide>(shaping, x, hn::Set(DF(), 1.0f), hn::Zero(DF()), key, position,
                                    slope, bias_start, first, end, derivative);
}

// The mask of one row over keys [first, end): scores[(j - first) * stride] for key j; the
// row of mask elements starts at key 0 (core/mask.hpp says what an element does).
template <class M>
void mask_scores(const M* mask_row, Index first, Index end, float* scores, Index stride) {
  for (Index j = first; j < end; ++j) {
    float& s = scores[(j - first) * stride];
    s = core::masked_score(s, mask_row[j]);
  }
}

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
