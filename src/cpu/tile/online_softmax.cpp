#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/tile/online_softmax.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/tile/online_softmax.hpp"

#include "cpu/tile/softmax-inl.h"
#include "cpu/tile/weight_pairs-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

Index OnlineSoftmaxRows(float* p, Index keys, Index stride, float* m, float* l, float* rescale,
                        float deferred_scale) {
  tile::online_softmax_rows(p, keys, stride, m, l, rescale, deferred_scale);
  return tile::lanes();
}

Index OnlineSoftmaxRowsToPairs(const float* p, Index keys, Index stride, float* m, float* l,
                               float* rescale, float deferred_scale, std::uint32_t* pairs,
                               Index rows, Index plane, int weight_parts) {
  tile::online_softmax_rows(p, keys, stride, m, l, rescale, deferred_scale,
                            tile::WeightPairSink{pairs, rows, plane, weight_parts});
  return tile::lanes();
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(OnlineSoftmaxRows);
HWY_EXPORT(OnlineSoftmaxRowsToPairs);

Index online_softmax_rows_dispatched(float* p, Index keys, Index stride, float* m, float* l,
                                     float* rescale, float deferred_scale) {
  return HWY_DYNAMIC_DISPATCH(OnlineSoftmaxRows)(p, keys, stride, m, l, rescale, deferred_scale);
}

Index online_softmax_rows_to_pairs_dispatched(const float* p, Index keys, Index stride, float* m,
                                              float* l, float* rescale, float deferred_scale,
                                              std::uint32_t* pairs, Index rows, Index plane,
                                              int weight_parts) {
  return HWY_DYNAMIC_DISPATCH(OnlineSoftmaxRowsToPairs)(
      p, keys, stride, m, l, rescale, deferred_scale, pairs, rows, plane, weight_parts);
}

}  // namespace attn::cpu
#endif
