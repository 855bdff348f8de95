// Tunables of forward's context (O = O corr + P V), in one place, with what must hold between
// them; the walk's own (tiles, items, the score micro-kernel) are in cpu/plan/traits.hpp.
// Measured as those were (tests/timing/kernel_timing, Zen 4, AVX3 target).
#pragma once

namespace attn::cpu {

struct ContextTraits {
  // Context micro-kernel (O += P V): kContextRows rows x up to kContextVectors vectors of
  // the value dim, P broadcast against V rows.
  static constexpr int kContextRows = 4;
  static constexpr int kContextVectors = 3;
  // 4 x 2 vectors: equal within noise at d=128, 12% slower at d=64 causal.

  // 16 vector registers on AVX2: accumulators plus one operand vector per column and one
  // broadcast must fit, or the micro-kernel spills.
  static_assert(kContextRows * kContextVectors + kContextVectors + 1 <= 16);
  static_assert(kContextVectors >= 1 && kContextVectors <= 3, "context_columns has 1 to 3");
  // A context block never straddles two row vectors: lanes are 4, 8 or 16 (the 1-lane
  // scalar target uses blocks of 1 row).
  static_assert(kContextRows == 4);
};

}  // namespace attn::cpu
