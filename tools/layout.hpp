// How the arrays of `attn run` sit in their files. The library sees [b, h, s, d] views;
// a file holds a C-order array in the user's layout, possibly with fewer dims.
#pragma once

#include <cstdint>
#include <string>

#include "attn/tensor.hpp"
#include "io/npy.hpp"

namespace attn::tools {

enum class Layout : std::uint8_t {
  bhsd,  // [batch, heads, seq, dim], as PyTorch's scaled_dot_product_attention
  bshd,  // [batch, seq, heads, dim], as FlashAttention
};

// "bhsd" or "bshd"; throws attn::Error otherwise.
Layout parse_layout(const std::string& name);

// A [b, h, s, d] view's dims and strides (in elements).
struct Placement {
  Dims shape;
  Dims strides;
};

// How a C-order array of `shape` in `layout` is seen as [b, h, s, d] without a copy. Dims
// missing from a lower-rank file are 1, batch missing first, then heads, then seq:
// bhsd [H, S, D] -> [1, H, S, D]; bshd [S, H, D] -> [1, H, S, D], bshd [S, D] -> [1, 1, S, D].
Placement place(Layout layout, const io::Shape& shape);

// Which dim of a rank-`rank` file (2 to 4 dims) in `layout` is the sequence.
std::size_t sequence_axis(Layout layout, std::size_t rank);

// The inverse of place(): the file shape of an array of [b, h, s, d] dims `bhsd` stored in
// `layout`, dropping extent-1 dims (batch first, then heads, then seq) down to `rank` dims.
io::Shape file_shape(Layout layout, const Dims& bhsd, std::size_t rank);

}  // namespace attn::tools
