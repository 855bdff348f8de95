// int4 cache elements: two signed 4-bit codes (-8 to 7) a byte, in llama.cpp's q4_0 order:
// within each block of 32 elements, element j (j < 16) is the low nibble of the block's byte
// j and element j + 16 its high nibble, so that a vector of up to 16 consecutive elements
// is one nibble of consecutive bytes (cpu/tile/stored_rows-inl.h).
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn {

struct Int4Pair {
  std::uint8_t bits = 0;
};

// The byte of element e of a row, and whether e is its high nibble.
inline Index int4_byte(Index e) {
  return e / 32 * 16 + e % 16;
}
constexpr bool int4_high(Index e) {
  return e % 32 >= 16;
}

// Element e of a row of codes.
inline int int4_code(const Int4Pair* row, Index e) {
  const int byte = row[int4_byte(e)].bits;
  const int nibble = int4_high(e) ? byte >> 4 : byte & 0xf;
  return nibble >= 8 ? nibble - 16 : nibble;
}

// Stores code (-8 to 7) as element e of a row.
inline void set_int4_code(Int4Pair* row, Index e, int code) {
  std::uint8_t& byte = row[int4_byte(e)].bits;
  const auto nibble = static_cast<std::uint8_t>(code & 0xf);
  byte = int4_high(e) ? static_cast<std::uint8_t>((byte & 0x0f) | (nibble << 4))
                      : static_cast<std::uint8_t>((byte & 0xf0) | nibble);
}

}  // namespace attn
