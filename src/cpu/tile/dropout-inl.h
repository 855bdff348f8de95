// Dropout's keep rule (core/dropout.hpp) for a vector of weights: each lane's row bits and
// key, the same integer arithmetic as core::dropout_bits, so every lane of every target
// drops what the reference drops.
#if defined(ATTN_CPU_TILE_DROPOUT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_DROPOUT_INL_H_
#undef ATTN_CPU_TILE_DROPOUT_INL_H_
#else
#define ATTN_CPU_TILE_DROPOUT_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "core/dropout.hpp"

#include "cpu/tile/target-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;

HWY_INLINE VU mix32(VU x) {
  const DU du;
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  x = hn::Mul(x, hn::Set(du, 0x7FEB352Du));
  x = hn::Xor(x, hn::ShiftRight<15>(x));
  x = hn::Mul(x, hn::Set(du, 0x846CA68Bu));
  return hn::Xor(x, hn::ShiftRight<16>(x));
}

// What each lane's weight is multiplied by: dropout.scale where kept, else 0. low and high:
// each lane's row bits (core::dropout_row); keys: each lane's key j, as 32-bit integers.
HWY_INLINE VF dropout_factor(VU low, VU high, VU keys, const core::Dropout& dropout) {
  const DF df;
  const DU du;
  const DI di;
  VU x = mix32(hn::Xor(low, hn::Mul(keys, hn::Set(du, core::kKeyStep))));
  x = hn::ShiftRight<32 - core::kDropoutBits>(mix32(hn::Xor(x, high)));
  const auto kept = hn::Gt(hn::BitCast(di, x), hn::Set(di, dropout.threshold - 1));
  return hn::IfThenElseZero(hn::RebindMask(df, kept),
                            hn::Set(df, static_cast<float>(dropout.scale)));
}

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
