// The kernels' weight pairs (weight_pairs-inl.h) through the dispatch, for tests.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::cpu {

// tile::put_weight_pairs on the best Highway target (or the one a test forces): the
// arguments of put_weight_parts (cpu/amx/context.hpp) with rows_stride == rows, a whole
// number of that target's vectors.
void put_weight_pairs_dispatched(const float* weights_t, Index weights_stride, Index first,
                                 Index end, Index span, Index rows, int weight_parts,
                                 std::uint32_t* parts);

}  // namespace attn::cpu
