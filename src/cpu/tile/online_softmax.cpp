#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/tile/online_softmax.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/tile/online_softmax.hpp"

#include "cpu/tile/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

Index OnlineSoftmaxRows(float* p, Index keys, Index stride, float* m, float* l, float* rescale,
                        float deferred_scale) {
  tile::online_softmax_rows(p, keys, stride, m, l, rescale, deferred_scale);
  return tile::lanes();
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(OnlineSoftmaxRows);

Index online_softmax_rows_dispatched(float* p, Index keys, Index stride, float* m, float* l,
                                     float* rescale, float deferred_scale) {
  return HWY_DYNAMIC_DISPATCH(OnlineSoftmaxRows)(p, keys, stride, m, l, rescale, deferred_scale);
}

}  // namespace attn::cpu
#endif
