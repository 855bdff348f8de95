#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/tile/widen.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/tile/widen.hpp"

#include "cpu/tile/stored_rows-inl.h"
#include "cpu/tile/to_floats-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

void WidenHalves(const float16* in, float* out, std::size_t count) {
  to_floats(in, static_cast<Index>(count), out);
}

void WidenBrainHalves(const bfloat16* in, float* out, std::size_t count) {
  to_floats(in, static_cast<Index>(count), out);
}

void WidenE4m3(const float8_e4m3* in, float* out, std::size_t count) {
  tile::widen_row(in, static_cast<Index>(count), out);
}

void WidenE5m2(const float8_e5m2* in, float* out, std::size_t count) {
  tile::widen_row(in, static_cast<Index>(count), out);
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(WidenHalves);
HWY_EXPORT(WidenBrainHalves);
HWY_EXPORT(WidenE4m3);
HWY_EXPORT(WidenE5m2);

void widen_array(const float16* in, float* out, std::size_t count) {
  HWY_DYNAMIC_DISPATCH(WidenHalves)(in, out, count);
}

void widen_array(const bfloat16* in, float* out, std::size_t count) {
  HWY_DYNAMIC_DISPATCH(WidenBrainHalves)(in, out, count);
}

void widen_array(const float8_e4m3* in, float* out, std::size_t count) {
  HWY_DYNAMIC_DISPATCH(WidenE4m3)(in, out, count);
}

void widen_array(const float8_e5m2* in, float* out, std::size_t count) {
  HWY_DYNAMIC_DISPATCH(WidenE5m2)(in, out, count);
}

}  // namespace attn::cpu
#endif
