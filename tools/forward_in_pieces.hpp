// attn::forward_into in pieces, so that `attn run` can show progress between them. Heads and
// batch entries are independent problems, so the pieces give exactly the results of one call
// (bitwise: every reduction inside a piece keeps its order).
#pragma once

#include <functional>

#include "attn/attention.hpp"

namespace attn::tools {

// Called after each piece with the pieces done and their total.
using ProgressCallback = std::function<void(Index done, Index total)>;

// The pieces forward_in_pieces would use: one per batch entry and KV head (its query heads
// with it), or one per batch entry when there are many of them.
Index count_pieces(const TensorView& q, const TensorView& k);

// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv], outputs as for forward_into.
// Checks the whole request first, so errors name the full shapes, then computes piece by
// piece, calling `progress` after each.
void forward_in_pieces(const TensorView& q, const TensorView& k, const TensorView& v,
                       const Options& options, const Outputs& outputs,
                       const ProgressCallback& progress);

}  // namespace attn::tools
