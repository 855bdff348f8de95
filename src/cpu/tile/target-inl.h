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
#include <type_traits>
#include <utility>

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
// 16 on SSE4 and AVX2, 32 on AVX-512 and on Arm's NEON and SVE. On Arm a decode step's
// instructions under qemu (bench/README.md) are 8.4% fewer with 32 on SVE_256, equal on NEON.
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

// ---- Register blocks ---------------------------------------------------------------------

// A micro-kernel's block of vectors (accumulators, operands) is a pack of locals, not an
// array: SVE's sizeless vectors can be neither array elements nor class members. Inlined,
// the pack compiles to the registers an array of vectors did on the fixed-width targets.

// Follows the parameters of a lambda that takes or makes a pack's vectors: inlined, its
// vectors stay in registers; called, they would go through memory by reference.
#ifndef ATTN_INLINE_LAMBDA
#define ATTN_INLINE_LAMBDA __attribute__((always_inline))
#endif

// Calls body(v_0, ..., v_{N-1}) with N vector locals, v_i = make(i) (i a compile-time
// std::integral_constant).
template <int N, class Make, class Body, class... Held>
HWY_INLINE void with_vectors(const Make& make, const Body& body, Held&... held) {
  if constexpr (sizeof...(Held) == N) {
    body(held...);
  } else {
    VF next = make(std::integral_constant<int, sizeof...(Held)>());
    with_vectors<N>(make, body, held..., next);
  }
}

// The I-th vector of a pack.
template <int I, class V, class... Rest>
HWY_INLINE V& nth_vector(V& first, Rest&... rest) {
  if constexpr (I == 0) {
    return first;
  } else {
    return nth_vector<I - 1>(rest...);
  }
}

// f(i) for i = 0 .. N-1 in order, i a compile-time std::integral_constant.
template <int N, class F, int... I>
HWY_INLINE void for_each_index(const F& f, std::integer_sequence<int, I...> = {}) {
  if constexpr (sizeof...(I) < N) {
    for_each_index<N>(f, std::make_integer_sequence<int, N>());
  } else {
    (f(std::integral_constant<int, I>()), ...);
  }
}

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
