// New tokens' rows written into pages: one run of tokens into consecutive slots of one page,
// for KVCache::append and attn::append_pages alike.
#pragma once

#include <cstdint>

#include "attn/paged.hpp"
#include "attn/tensor.hpp"
#include "cache/page_rows.hpp"

namespace attn::cache {

// The tokens to write: [1, Hkv, n, dim] (KVCache::append) or, tokens_first, [1, n, Hkv, dim]
// (engines' [tokens, heads, dim]); any float dtype, contiguous last dim.
struct NewRows {
  TensorView rows;
  bool tokens_first = false;
  // Rotated at rotary->positions[i] (token i of rows) as they are written, when given.
  const Rotary* rotary = nullptr;

  Index tokens() const { return rows.shape[tokens_first ? 1 : 2]; }
  // Token i's row of KV head h is rows[0, index1, index2].
  Index index1(Index i, Index h) const { return tokens_first ? i : h; }
  Index index2(Index i, Index h) const { return tokens_first ? h : i; }
};

// Pools of codes (int8, fp8) hold no value that is not finite: for them, throws naming
// `name`, the dtype, the head and the token, before anything is written.
void check_finite_for_codes(const char* name, const NewRows& in, Index heads_kv, CacheDType dtype);

// Writes tokens [first, first + count) of `in` into slots [slot, slot + count) of the page,
// rounded to the pool's dtype. int8, int4: each token's row of each KV head (or each group
// of it) with a scale of its own, so nothing written before changes; fp8: each element
// alone.
void write_run(const PageRows& pool, std::int32_t page, Index slot, const NewRows& in, Index first,
               Index count);

}  // namespace attn::cache
