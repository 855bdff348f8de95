// Dropout's keep rule (Options::dropout_p, dropout_seed): whether weight (b, h, i, j) is
// kept is a pure function of the seed and those four indices, so forward and backward, the
// reference and the fast kernels, any thread count and any CPU drop the same weights. The
// one scalar definition, read by the reference and attn::dropout_mask; the fast kernels'
// vector twin is cpu/tile/dropout-inl.h (integer arithmetic: the same bits in every lane).
//   row bits  r = mix64 over (seed, b, h, i) in turn            (once per query row)
//   key bits  x = mix32(mix32(r.low ^ j * kKeyStep) ^ r.high) >> 8   (24 bits per weight)
//   kept      x >= threshold = ceil(p * 2^24)
// mix64 is splitmix64's finaliser, mix32 Wellons' lowbias32; both are bijections, so
// distinct keys of one row never share their first mix.
#pragma once

#include <cmath>
#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::core {

constexpr std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9u;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBu;
  return x ^ (x >> 31);
}

constexpr std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

// Key j enters its row's first mix as j * kKeyStep (odd, so a bijection of 32-bit keys).
inline constexpr std::uint32_t kKeyStep = 0x9E3779B9u;
inline constexpr int kDropoutBits = 24;

struct DropoutRow {
  std::uint32_t low = 0, high = 0;
};

constexpr DropoutRow dropout_row(std::uint64_t seed, Index b, Index h, Index i) {
  std::uint64_t x = mix64(seed);
  for (const Index index : {b, h, i}) x = mix64(x ^ static_cast<std::uint64_t>(index));
  return {static_cast<std::uint32_t>(x), static_cast<std::uint32_t>(x >> 32)};
}

constexpr std::int32_t dropout_bits(DropoutRow row, Index j) {
  const std::uint32_t x = mix32(row.low ^ (static_cast<std::uint32_t>(j) * kKeyStep));
  return static_cast<std::int32_t>(mix32(x ^ row.high) >> (32 - kDropoutBits));
}

struct Dropout {
  double p = 0.0;  // checked: 0 <= p <= 1
  std::uint64_t seed = 0;
  std::int32_t threshold = 0;  // kept where dropout_bits >= threshold
  double scale = 1.0;          // of a kept weight: 1 / (1 - p), or 0 when p = 1 (none kept)

  bool on() const { return p > 0.0; }
  bool keeps(DropoutRow row, Index j) const { return dropout_bits(row, j) >= threshold; }
  // What weight (row, j) is multiplied by: scale where kept, else 0.
  double factor(DropoutRow row, Index j) const { return keeps(row, j) ? scale : 0.0; }
};

inline Dropout make_dropout(double p, std::uint64_t seed) {
  Dropout d;
  d.p = p;
  d.seed = seed;
  d.threshold = static_cast<std::int32_t>(std::ceil(p * double{1 << kDropoutBits}));
  d.scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  return d;
}

}  // namespace attn::core
