// What every piece of the tile core takes from the Highway target it is compiled for: the
// vector types, the lane count and the register budget (include this header, as every
// -inl.h of src/cpu/tile, after foreach_target.h).
#if defined(ATTN_CPU_TILE_TARGET_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_TARGET_INL_H_
#undef ATTN_CPU_TILE_TARGET_INL_H_
#else
#define ATTN_CPU_TILE_TARGET_INL_H_
#endif

#include <hwy/highway.h>

#include <limits>

#include "attn/tensor.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

inline constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// Vector registers a micro-kernel may fill with accumulators and operands before it spills:
// 16 on SSE4 and AVX2, 32 on AVX-512 (and on Arm's NEON and SVE).
inline constexpr int kVectorRegisters = HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3 ? 16 : 32;

// An x86 AVX-512 target: where forward and the weights pass may score bf16 by AVX512-BF16
// dot products (cpu/bf16_dot.hpp).
inline constexpr bool kAvx512Target = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3;

inline Index lanes() {
  return static_cast<Index>(hn::Lanes(DF()));
}

// a * b + c as this target's hn::MulAdd computes it in a lane: fused where the target has
// FMA, a product rounded then a sum on SSE4 and the emulated targets. The scalar twin of a
// vector chain that must give the chain's bits.
HWY_INLINE float lane_mul_add(float a, float b, float c) {
  const DF df;
  return hn::GetLane(hn::MulAdd(hn::Set(df, a), hn::Set(df, b), hn::Set(df, c)));
}

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
