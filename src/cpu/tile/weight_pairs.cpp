#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/tile/weight_pairs.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/tile/weight_pairs.hpp"

#include "cpu/tile/weight_pairs-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

void PutWeightPairs(const float* weights_t, Index weights_stride, Index first, Index end,
                    Index span, Index rows, int weight_parts, std::uint32_t* parts) {
  tile::put_weight_pairs(weights_t, weights_stride, first, end, span, rows, weight_parts, parts);
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(PutWeightPairs);

void put_weight_pairs_dispatched(const float* weights_t, Index weights_stride, Index first,
                                 Index end, Index span, Index rows, int weight_parts,
                                 std::uint32_t* parts) {
  HWY_DYNAMIC_DISPATCH(PutWeightPairs)
  (weights_t, weights_stride, first, end, span, rows, weight_parts, parts);
}

}  // namespace attn::cpu
#endif
