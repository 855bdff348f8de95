// Tunables of the fast backward kernel, in one place, with what must hold between them.
#pragma once

namespace attn::cpu {

struct BackwardTraits {
  // dK/dV pass (keys across lanes): a work item is kKeyVectors vectors of keys; query rows
  // stream past it kQueryTile at a time, kScoreRows rows per score micro-kernel call.
  static constexpr int kKeyVectors = 2;
  static constexpr int kQueryTile = 64;
  static constexpr int kScoreRows = 4;
  // dQ pass (query rows across lanes): a work item is up to kRowVectors vectors of rows of
  // one head; keys stream past it kKeyTile at a time, kScoreKeys per micro-kernel call.
  static constexpr int kRowVectors = 3;
  static constexpr int kKeyTile = 64;
  static constexpr int kScoreKeys = 4;
  // Both passes: products accumulated into rows of d (O += A^T B) take kContextRows rows
  // by up to kContextVectors vectors of columns.
  static constexpr int kContextRows = 4;
  static constexpr int kContextVectors = 3;

  static_assert(kQueryTile % kScoreRows == 0, "a query tile holds whole score blocks");
  static_assert(kKeyTile % kScoreKeys == 0, "a key tile holds whole score blocks");
  // 16 vector registers on AVX2: accumulators plus operands must fit, or the kernels spill.
  static_assert(kScoreRows * kKeyVectors + kKeyVectors + 1 <= 16);
  static_assert(kScoreKeys * kRowVectors + kRowVectors + 1 <= 16);
  static_assert(kContextRows * kContextVectors + kContextVectors + 1 <= 16);
  static_assert(kContextVectors >= 1 && kContextVectors <= 3, "accumulate has 1 to 3");
};

}  // namespace attn::cpu
