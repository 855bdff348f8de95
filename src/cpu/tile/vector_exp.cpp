#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/tile/vector_exp.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>

#include "cpu/tile/vector_exp.hpp"

#include "cpu/tile/vector_exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

// in, out: [count]
void ExpArray(const float* in, float* out, std::size_t count) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + lanes <= count; i += lanes)
    hn::StoreU(VectorExp(df, hn::LoadU(df, in + i)), df, out + i);
  if (i < count) {
    HWY_ALIGN float tail[hn::MaxLanes(df)] = {};
    std::copy(in + i, in + count, tail);
    hn::Store(VectorExp(df, hn::Load(df, tail)), df, tail);
    std::copy(tail, tail + (count - i), out + i);
  }
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(ExpArray);

void exp_array(const float* in, float* out, std::size_t count) {
  HWY_DYNAMIC_DISPATCH(ExpArray)(in, out, count);
}

}  // namespace attn::cpu
#endif
