// attn::dropout_mask: which weights dropout keeps for a seed (Options::dropout_p and
// dropout_seed), the mask forward and backward apply, for a caller who wants to see it
// (FlashAttention's return_attn_probs shows it) or to check it. Weight (b, h, i, j) is kept
// with probability 1 - dropout_p in steps of 2^-24, as a function of the seed and (b, h, i, j)
// alone: rows and columns of q and k as the call passes them (packed sequences: rows and
// columns of the packed arrays).
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn {

// shape: [B, Hq, Lq, Lk] (each >= 0). Returns a boolean tensor of that shape: true where the
// weight is kept. Throws attn::Error naming the argument on bad input.
Tensor dropout_mask(const Dims& shape, double dropout_p, std::uint64_t seed);

}  // namespace attn
