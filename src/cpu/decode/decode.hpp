// The fast CPU decode kernel (flash-decoding over a paged KVCache). attn::decode validates
// its arguments into a DecodeProblem; the kernel fills a float32 State.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/kv_cache.hpp"
#include "attn/options.hpp"
#include "attn/state.hpp"
#include "core/score_rule.hpp"

namespace attn::cpu {

struct DecodeProblem {
  TensorView q;  // [S, Hq, n_q, D]
  const KVCache* cache = nullptr;
  std::vector<const std::vector<std::int32_t>*> tables;  // [S]: each sequence's block table
  std::vector<Index> lengths;                            // [S]: keys per sequence
  Index heads_q = 0, heads_kv = 0, dim = 0, dim_v = 0, queries = 0;
  core::ScoreRule rule;  // causal_align is always bottom-right: the queries are the newest
  int threads = 0;       // Options::threads

  Index sequences() const { return static_cast<Index>(lengths.size()); }
  Index group_size() const { return heads_q / heads_kv; }
  // Key position of query i of a sequence of `length` keys: its newest tokens are the
  // queries (bottom-right), moved by the offset.
  Index query_position(Index length, Index i) const {
    return rule.query_position(i, queries, length);
  }
};

// state: m, l [S, Hq, n_q, 1] and acc [S, Hq, n_q, Dv], float32, sinks not included.
// Bitwise identical for any thread count.
void decode(const DecodeProblem& problem, State& state);

}  // namespace attn::cpu
