// Vector exp for the softmax of the fast kernels, written once against Highway's portable
// ops and compiled per target (include this header after foreach_target.h).
//
// Max error: 2 ulp (worst measured 1.24) relative to std::exp over the valid range
// [-87.33654, 88.0], checked by tests/cpu_vector_exp_test.cpp, which sweeps the range.
// Below -87.33654 (where exp leaves the normal floats) the result is exactly 0, so
// exp(-inf) = 0 and hidden keys get weight 0; above 88 the input is clamped (attention
// only exponentiates s - max <= 0). NaN in gives NaN out.
#if defined(ATTN_CPU_VECTOR_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_VECTOR_EXP_INL_H_
#undef ATTN_CPU_VECTOR_EXP_INL_H_
#else
#define ATTN_CPU_VECTOR_EXP_INL_H_
#endif

#include <hwy/highway.h>

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

// Whether this target builds exp's 2^n by vscalefps and rounds n by vrndscaleps (x86's
// AVX-512 targets), or by the shifter's bits (every other target).
#undef ATTN_EXP_BY_SCALEF
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define ATTN_EXP_BY_SCALEF 1
#else
#define ATTN_EXP_BY_SCALEF 0
#endif

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr float kExpLowest = -87.33654f;  // ln(FLT_MIN)
inline constexpr float kExpHighest = 88.0f;      // 2^n stays finite for n = round(x log2 e)

#if ATTN_EXP_BY_SCALEF
// v * 2^n, n integral (vscalefps, AVX512VL for the narrower vectors): the product a
// multiply by 2^n as a float gives, rounded once, for every n VectorExp passes. The
// zero-masking forms with every lane kept: GCC 12's unmasked ones start from an undefined
// vector, which -Werror=maybe-uninitialized refuses.
HWY_INLINE hn::Vec512<float> ScaleByPowerOfTwo(hn::Vec512<float> v, hn::Vec512<float> n) {
  return hn::Vec512<float>{_mm512_maskz_scalef_ps(__mmask16{0xFFFF}, v.raw, n.raw)};
}
HWY_INLINE hn::Vec256<float> ScaleByPowerOfTwo(hn::Vec256<float> v, hn::Vec256<float> n) {
  return hn::Vec256<float>{_mm256_maskz_scalef_ps(__mmask8{0xFF}, v.raw, n.raw)};
}
template <size_t N>
HWY_INLINE hn::Vec128<float, N> ScaleByPowerOfTwo(hn::Vec128<float, N> v, hn::Vec128<float, N> n) {
  return hn::Vec128<float, N>{_mm_maskz_scalef_ps(__mmask8{0xFF}, v.raw, n.raw)};
}
#endif

// exp(x) = 2^n exp(r), n = round(x log2 e), r = x - n ln 2 in two parts (Cody-Waite) so
// that r is exact; exp(r) on |r| <= ln(2)/2 by the Cephes expf polynomial.
// Adding 1.5 * 2^23 to x log2 e rounds it to the nearest even integer n, as Round does,
// and puts n in the float's low mantissa bits, so 2^n needs no float-to-int conversion
// (Highway's ConvertTo adds four ops on AVX2 to guard against overflow |n| <= 127 never
// reaches).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V VectorExp(D d, V x) {
#if ATTN_EXP_BY_SCALEF
  // AVX-512: n by one rounding (vrndscaleps, ties to even as the shifter rounds) and 2^n by
  // vscalefps: four instructions fewer (no Max clamp either: a lane below kExpLowest is 0
  // whatever its r), and the same bits for every float32 input (all 2^32 compared with the
  // shifter form, -ffp-contract=off as the build).
  const V clamped = hn::Min(hn::Set(d, kExpHighest), x);
  const V n = hn::Round(hn::Mul(clamped, hn::Set(d, 1.44269504088896341f)));
#else
  const hn::RebindToSigned<D> di;
  const V clamped = hn::Max(hn::Set(d, kExpLowest), hn::Min(hn::Set(d, kExpHighest), x));
  const V shifter = hn::Set(d, 12582912.0f);
  const V shifted = hn::Add(hn::Mul(clamped, hn::Set(d, 1.44269504088896341f)), shifter);
  const V n = hn::Sub(shifted, shifter);
#endif
  V r = hn::MulAdd(n, hn::Set(d, -0.693359375f), clamped);
  r = hn::MulAdd(n, hn::Set(d, 2.12194440e-4f), r);
  V p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  const V exp_r = hn::MulAdd(hn::Mul(p, r), r, hn::Add(r, hn::Set(d, 1.0f)));
#if ATTN_EXP_BY_SCALEF
  const V scaled = ScaleByPowerOfTwo(exp_r, n);
#else
  // The low 9 bits of the shifted float's bits are n mod 512; n + 127 lies in [1, 254].
  const auto biased = hn::Add(hn::BitCast(di, shifted), hn::Set(di, 127));
  const V scaled = hn::Mul(exp_r, hn::BitCast(d, hn::ShiftLeft<23>(biased)));
#endif
  const V result = hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, kExpLowest)), scaled);
  // Min/Max may drop a NaN (they do on the scalar target), so pass it through here.
  return hn::IfThenElse(hn::IsNaN(x), x, result);
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
