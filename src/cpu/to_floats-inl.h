// Widening a row of f16/bf16/f32 inputs to float32 and narrowing float32 results back,
// written once against Highway and compiled per target (include this header after
// foreach_target.h).
#if defined(ATTN_CPU_TO_FLOATS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TO_FLOATS_INL_H_
#undef ATTN_CPU_TO_FLOATS_INL_H_
#else
#define ATTN_CPU_TO_FLOATS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <type_traits>

#include "attn/half.hpp"
#include "attn/tensor.hpp"
#include "core/element_type.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

// out[0 .. n) = in[0 .. n) as float (float64 rounded), vectorised for the 16-bit types.
template <class T>
void to_floats(const T* HWY_RESTRICT in, Index n, float* HWY_RESTRICT out) {
  namespace hn = hwy::HWY_NAMESPACE;
  if constexpr (std::is_same_v<T, float>) {
    std::copy(in, in + n, out);
  } else if constexpr (std::is_same_v<T, double>) {
    for (Index i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
  } else {
    using Hwy = std::conditional_t<std::is_same_v<T, float16>, hwy::float16_t, hwy::bfloat16_t>;
    const hn::ScalableTag<float> df;
    const hn::Rebind<Hwy, decltype(df)> dh;
    const Index lanes = static_cast<Index>(hn::Lanes(df));
    const Hwy* from = reinterpret_cast<const Hwy*>(in);
    const Index whole = n - n % lanes;
    for (Index i = 0; i < whole; i += lanes) {
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, from + i)), df, out + i);
    }
    for (Index i = whole; i < n; ++i) out[i] = to_float(in[i]);
  }
}

// out[0 .. n) = in[0 .. n) in the output's dtype (rounded to nearest for the 16-bit types).
template <class T>
void from_floats(const float* HWY_RESTRICT in, Index n, T* HWY_RESTRICT out) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(in, in + n, out);
  } else {
    for (Index i = 0; i < n; ++i) out[i] = core::from_float<T>(in[i]);
  }
}

// Rows [first, first + count) of x[b][h] as float32 rows of `padded` floats (zeros past
// `width`): x's own rows when they are f32 and padded == width, else rows converted into
// `scratch` ([count][padded]). Returns the first row and the distance between rows.
struct FloatRows {
  const float* rows;
  Index stride;
};

inline FloatRows rows_as_floats(const TensorView& x, Index b, Index h, Index first, Index count,
                                Index width, Index padded, float* HWY_RESTRICT scratch) {
  if (x.dtype == DType::f32 && width == padded) {
    return {core::row_of<float>(x, b, h, first), x.strides[2]};
  }
  core::with_float_type(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (Index j = 0; j < count; ++j) {
      float* out = scratch + j * padded;
      to_floats(core::row_of<T>(x, b, h, first + j), width, out);
      std::fill(out + width, out + padded, 0.0f);
    }
  });
  return {scratch, padded};
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_TO_FLOATS_INL_H_
