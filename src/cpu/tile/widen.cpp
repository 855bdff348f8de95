#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/tile/widen.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/tile/widen.hpp"

#include "cpu/tile/to_floats-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

void WidenHalves(const float16* in, float* out, std::size_t count) {
  to_floats(in, static_cast<Index>(count), out);
}

void WidenBrainHalves(const bfloat16* in, float* out, std::size_t count) {
  to_floats(in, static_cast<Index>(count), out);
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(WidenHalves);
HWY_EXPORT(WidenBrainHalves);

void widen_array(const float16* in, float* out, std::size_t count) {
  HWY_DYNAMIC_DISPATCH(WidenHalves)(in, out, count);
}

void widen_array(const bfloat16* in, float* out, std::size_t count) {
  HWY_DYNAMIC_DISPATCH(WidenBrainHalves)(in, out, count);
}

}  // namespace attn::cpu
#endif
