// The paged attention kernel (flash-decoding over pages): attn::decode (over a KVCache) and
// attn::paged_attention (over the caller's pools) validate their arguments into a
// DecodeProblem; the kernel fills a float32 State.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attn/options.hpp"
#include "attn/paged.hpp"
#include "attn/state.hpp"
#include "cache/page_rows.hpp"
#include "core/score_rule.hpp"

namespace attn::cpu {

// Where row (sequence s, head, query i) lies in an array of rows: seq_base[s] + head *
// head_stride + i * token_stride, in elements (queries) or in rows (the state).
struct RowPlaces {
  std::vector<Index> seq_base;  // [S]
  Index head_stride = 0, token_stride = 0;

  Index at(Index s, Index head, Index i) const {
    return seq_base[static_cast<std::size_t>(s)] + head * head_stride + i * token_stride;
  }
};

struct DecodeProblem {
  const void* q = nullptr;  // rows of dim elements of q_dtype, contiguous
  DType q_dtype = DType::f32;
  RowPlaces q_rows;                // in elements of q
  RowPlaces state_rows;            // rows of the State the kernel fills
  std::vector<Index> query_start;  // [S + 1]: sequence s has query_start[s + 1] - query_start[s]
  cache::PageRows keys, values;
  std::vector<std::span<const std::int32_t>> tables;  // [S]: each sequence's pages in order
  std::vector<Index> lengths;                         // [S]: keys per sequence
  Index heads_q = 0, heads_kv = 0, dim = 0, dim_v = 0;
  core::ScoreRule rule;  // causal_align is always bottom-right: the queries are the newest
  int threads = 0;       // Options::threads
  // Options::pv_precision: bf16 rounds P where P V runs on bf16 products (a bf16 cache on
  // a CPU with AVX512-BF16).
  PvPrecision pv_precision = PvPrecision::bf16;
  // Queries are rotated at rotary->positions[query_start[s] + i], or at their key position
  // when it holds none.
  const Rotary* rotary = nullptr;

  Index sequences() const { return static_cast<Index>(lengths.size()); }
  Index group_size() const { return heads_q / heads_kv; }
  Index page_size() const { return keys.page_size; }
  Index queries(Index s) const {
    return query_start[static_cast<std::size_t>(s) + 1] - query_start[static_cast<std::size_t>(s)];
  }
  // Key position of query i of sequence s: its newest tokens are the queries
  // (bottom-right), moved by the offset; negative when it has more queries than keys.
  Index query_position(Index s, Index i) const {
    return rule.query_position(i, queries(s), lengths[static_cast<std::size_t>(s)]);
  }
  Index rotary_position(Index s, Index i) const {
    if (rotary->positions.empty()) return query_position(s, i);
    return rotary
        ->positions[static_cast<std::size_t>(query_start[static_cast<std::size_t>(s)] + i)];
  }
};

// Fills the state rows of every (sequence, head, query): m, l [rows, 1] and acc [rows, Dv],
// float32, sinks not included. Each row's bits depend on its own sequence's queries, keys
// and options only: not on the thread count, the page size, the other sequences of the
// call or its own sequence's other queries (see DecodeTraits).
void decode(const DecodeProblem& problem, State& state);

}  // namespace attn::cpu
