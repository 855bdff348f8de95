// A chunk's weights as forward's bf16 products of P V take them (AMX tiles, vdpbf16ps): the
// vector twin of put_weight_parts (cpu/amx/context.hpp), to its bits, a vector of rows at a
// time: the scalar loop, a weight at a time, took longer than the products it fed
// (bench/README.md).
#if defined(ATTN_CPU_TILE_WEIGHT_PAIRS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_WEIGHT_PAIRS_INL_H_
#undef ATTN_CPU_TILE_WEIGHT_PAIRS_INL_H_
#else
#define ATTN_CPU_TILE_WEIGHT_PAIRS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "attn/tensor.hpp"
#include "cpu/amx/context.hpp"

#include "cpu/tile/target-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

// One pair of keys' weights for a vector of rows as put_weight_parts lays them: a (the even
// key's) in each uint32's low half, b in its high half; weight_parts 1: rounded to bf16 (to
// nearest, ties to even), else parts that each truncate what the ones before left, so that
// they sum to the weight exactly. Part q goes to pair[q * plane].
HWY_INLINE void store_weight_pair(VF a, VF b, int weight_parts, Index plane,
                                  std::uint32_t* HWY_RESTRICT pair) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const auto high_half = hn::Set(du, 0xFFFF0000u);
  if (weight_parts == 1) {
    const auto rounded = [&](VF w) ATTN_INLINE_LAMBDA {
      const auto bits = hn::BitCast(du, w);
      const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
      return hn::And(hn::Add(hn::Add(bits, hn::Set(du, 0x7FFFu)), odd), high_half);
    };
    hn::StoreU(hn::Or(hn::ShiftRight<16>(rounded(a)), rounded(b)), du, pair);
    return;
  }
  for (int q = 0; q < weight_parts; ++q) {
    const auto a_part = hn::And(hn::BitCast(du, a), high_half);
    const auto b_part = hn::And(hn::BitCast(du, b), high_half);
    hn::StoreU(hn::Or(hn::ShiftRight<16>(a_part), b_part), du, pair + q * plane);
    a = hn::Sub(a, hn::BitCast(df, a_part));
    b = hn::Sub(b, hn::BitCast(df, b_part));
  }
}

// put_weight_parts' rows_stride and `rows` in one: a whole number of vectors of rows.
inline void put_weight_pairs(const float* HWY_RESTRICT weights_t, Index weights_stride, Index first,
                             Index end, Index span, Index rows, int weight_parts,
                             std::uint32_t* HWY_RESTRICT parts) {
  const DF df;
  const Index n = lanes(), plane = span / 2 * rows;
  for (Index k = 0; k < span; k += 2) {
    const bool even_seen = k >= first && k < end, odd_seen = k + 1 >= first && k + 1 < end;
    const float* even = weights_t + (even_seen ? k - first : 0) * weights_stride;
    const float* odd = weights_t + (odd_seen ? k + 1 - first : 0) * weights_stride;
    std::uint32_t* pair = parts + k / 2 * rows;
    for (Index r = 0; r < rows; r += n) {
      const VF a = even_seen ? hn::LoadU(df, even + r) : hn::Zero(df);
      const VF b = odd_seen ? hn::LoadU(df, odd + r) : hn::Zero(df);
      store_weight_pair(a, b, weight_parts, plane, pair + r);
    }
  }
}

// The weights of one vector of rows as online_softmax_rows makes them (its Put), laid as
// put_weight_pairs lays them, for a chunk whose first key starts a pair: pairs points at the
// vector's rows of the chunk's first pair. The float weights are never stored.
struct WeightPairSink {
  std::uint32_t* pairs;
  Index rows, plane;
  int weight_parts;

  HWY_INLINE void operator()(Index j, VF even, VF odd) const {
    store_weight_pair(even, odd, weight_parts, plane, pairs + j / 2 * rows);
  }
  HWY_INLINE void operator()(Index j, VF even) const {
    store_weight_pair(even, hn::Zero(DF()), weight_parts, plane, pairs + j / 2 * rows);
  }
};

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
