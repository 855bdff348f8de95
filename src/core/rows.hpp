// Reading and writing one row (the contiguous last dim) of a view of any dtype, converting
// to and from double. Used by the reference and by I/O, never in a fast kernel's hot loop.
#pragma once

#include "attn/tensor.hpp"

namespace attn::core {

// out[0 .. shape[3]) = t[b, h, s, :]
void load_row(const TensorView& t, Index b, Index h, Index s, double* out);
// t[b, h, s, :] = in[0 .. shape[3]), rounded to t's dtype
void store_row(const MutableTensorView& t, Index b, Index h, Index s, const double* in);
double load_element(const TensorView& t, Index b, Index h, Index s, Index d);

}  // namespace attn::core
