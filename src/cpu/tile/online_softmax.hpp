// The online softmax of the walk (softmax-inl.h) through the dispatch, for tests.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::cpu {

// tile::online_softmax_rows on the best Highway target (or the one a test forces): one
// vector of that target's rows, scores at p[j * stride] for keys [0, keys), m, l and rescale
// a vector each, all on vector boundaries; deferred_scale > 0: the scores are still to be
// multiplied by it. Returns the rows it took: the target's lanes.
Index online_softmax_rows_dispatched(float* p, Index keys, Index stride, float* m, float* l,
                                     float* rescale, float deferred_scale);

// The same softmax with the weights put in pairs as put_weight_pairs lays them
// (tile::WeightPairSink; pairs at the vector's rows of key 0's pair, `rows` rows a pair,
// `plane` words a part) instead of in place; the scores stay.
Index online_softmax_rows_to_pairs_dispatched(const float* p, Index keys, Index stride, float* m,
                                              float* l, float* rescale, float deferred_scale,
                                              std::uint32_t* pairs, Index rows, Index plane,
                                              int weight_parts);

}  // namespace attn::cpu
