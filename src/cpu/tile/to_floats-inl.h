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
#include <cstdint>
#include <type_traits>

#include "attn/half.hpp"
#include "attn/tensor.hpp"
#include "core/element_type.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

// Whether this target widens f16 by its own instruction (F16C on AVX2 and up, NEON, ...).
// Highway's emulation on the x86 targets below AVX2 and on EMU128 and SCALAR turns
// infinities and NaN into finite numbers (exponent 31 rebiased as if it were a number).
inline constexpr bool kHardwareHalfWidening = !(HWY_ARCH_X86 && HWY_TARGET > HWY_AVX2) &&
                                              HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR;

// A vector of float16 or bfloat16 elements from `from`, widened to float32 exactly (NaN
// and infinities included).
template <class T, class DF>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DF> load_widened(DF df, const T* HWY_RESTRICT from) {
  namespace hn = hwy::HWY_NAMESPACE;
  using Hwy = std::conditional_t<std::is_same_v<T, float16>, hwy::float16_t, hwy::bfloat16_t>;
  if constexpr (std::is_same_v<T, bfloat16> || kHardwareHalfWidening) {
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<Hwy, DF>(), reinterpret_cast<const Hwy*>(from)));
  } else {
    // By bits: sign, then exponent and mantissa moved into place and rebiased by a multiply
    // by 2^112 (exact, subnormals too), then exponent 31 made 255 (infinity, NaN).
    const hn::RebindToUnsigned<DF> du;
    const hn::RebindToSigned<DF> di;
    const auto bits = hn::PromoteTo(du, hn::LoadU(hn::Rebind<std::uint16_t, DF>(),
                                                  reinterpret_cast<const std::uint16_t*>(from)));
    const auto magnitude = hn::And(bits, hn::Set(du, 0x7FFFu));
    const auto sign = hn::ShiftLeft<16>(hn::Xor(bits, magnitude));
    const auto moved = hn::ShiftLeft<13>(magnitude);
    const auto finite = hn::BitCast(du, hn::Mul(hn::BitCast(df, moved), hn::Set(df, 0x1p112f)));
    const auto special = hn::Or(moved, hn::Set(du, 0x7F800000u));
    const auto is_special =
        hn::RebindMask(du, hn::Gt(hn::BitCast(di, magnitude), hn::Set(di, 0x7BFF)));
    return hn::BitCast(df, hn::Or(sign, hn::IfThenElse(is_special, special, finite)));
  }
}

// out[0 .. n) = in[0 .. n) as float (float64 rounded), vectorised for the 16-bit types.
template <class T>
void to_floats(const T* HWY_RESTRICT in, Index n, float* HWY_RESTRICT out) {
  namespace hn = hwy::HWY_NAMESPACE;
  if constexpr (std::is_same_v<T, float>) {
    std::copy(in, in + n, out);
  } else if constexpr (std::is_same_v<T, double>) {
    for (Index i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
  } else {
    const hn::ScalableTag<float> df;
    const Index lanes = static_cast<Index>(hn::Lanes(df));
    const Index whole = n - n % lanes;
    for (Index i = 0; i < whole; i += lanes) hn::StoreU(load_widened(df, in + i), df, out + i);
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

// Rows of floats that a pass reads a few columns at a time, many rows in turn (forward's
// context over a V tile), stay in L1 only when the distance between them spreads them over
// its sets: not a multiple of two 64-byte lines. At 512 bytes (d = 128, f32) a tile's rows
// fall into 8 of Zen 3's 64 sets, and forward ran 4-5% slower than with them 576 apart.
inline constexpr Index kLineFloats = 16;

inline bool spreads_over_l1_sets(Index stride) {
  return stride % (2 * kLineFloats) != 0;
}

// The distance that spreads rows of `padded` floats: whole lines, an odd number of them.
inline Index spread_row_stride(Index padded) {
  const Index lines = (padded + kLineFloats - 1) / kLineFloats;
  return (lines % 2 == 0 ? lines + 1 : lines) * kLineFloats;
}

// The distances between rows a caller of rows_as_floats can use: any; only those that
// spread the rows over the L1 sets; or that spread for rows it converts (a copy made
// anyway), f32 rows read in place whatever their distance.
enum class RowDistance { any, spread, spread_copies };

// Rows [first, first + count) of x[b][h] as float32 rows of `padded` floats (zeros past
// `width`): x's own rows when they are f32, padded == width and their distance will do,
// else rows converted into `scratch`, `padded` floats apart (RowDistance::spread and
// spread_copies: spread_row_stride(padded)). Returns the first row and the distance between
// rows.
struct FloatRows {
  const float* rows;
  Index stride;
};

inline FloatRows rows_as_floats(const TensorView& x, Index b, Index h, Index first, Index count,
                                Index width, Index padded, RowDistance distance,
                                float* HWY_RESTRICT scratch) {
  const bool spread = distance != RowDistance::any;
  if (x.dtype == DType::f32 && width == padded &&
      (distance != RowDistance::spread || spreads_over_l1_sets(x.strides[2]))) {
    return {core::row_of<float>(x, b, h, first), x.strides[2]};
  }
  const Index stride = spread ? spread_row_stride(padded) : padded;
  core::with_float_type(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (Index j = 0; j < count; ++j) {
      float* out = scratch + j * stride;
      to_floats(core::row_of<T>(x, b, h, first + j), width, out);
      std::fill(out + width, out + padded, 0.0f);
    }
  });
  return {scratch, stride};
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_TO_FLOATS_INL_H_
