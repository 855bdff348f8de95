// attn::paged_attention: the caller's pools, page table and ragged queries checked (each
// rejection naming its argument) into a problem for the paged kernel, then finalize with
// the sinks, rows put back in the caller's [token, head] order.
#include "attn/paged.hpp"

#include <algorithm>
#include <string>

#include "api/page_pools.hpp"
#include "api/paged_step.hpp"
#include "core/argument_checks.hpp"
#include "core/rotary.hpp"

namespace attn {
namespace {

using core::fail;

// The batch's offsets, lengths and table, whole and inside the pool; returns S.
Index check_batch(const PagedBatch& batch, Index total_q, const PagePool& pool) {
  if (batch.query_start.empty()) fail("query_start", "S + 1 offsets", "none");
  const auto sequences = static_cast<Index>(batch.query_start.size()) - 1;
  if (batch.query_start[0] != 0) {
    fail("query_start", "offsets from 0",
         "query_start[0] = " + std::to_string(batch.query_start[0]));
  }
  for (Index s = 0; s < sequences; ++s) {
    if (batch.query_start[s + 1] < batch.query_start[s]) {
      fail("query_start", "non-decreasing offsets",
           "query_start[" + std::to_string(s + 1) +
               "] = " + std::to_string(batch.query_start[s + 1]) + " after " +
               std::to_string(batch.query_start[s]));
    }
  }
  if (batch.query_start[sequences] != total_q) {
    fail("query_start", "a last offset equal to q's " + std::to_string(total_q) + " rows",
         std::to_string(batch.query_start[sequences]));
  }
  if (static_cast<Index>(batch.seq_lens.size()) != sequences) {
    fail("seq_lens", std::to_string(sequences) + " lengths (one per sequence of query_start)",
         std::to_string(batch.seq_lens.size()));
  }
  if (batch.max_pages < 0) fail("max_pages", "a count >= 0", std::to_string(batch.max_pages));
  if (static_cast<Index>(batch.block_table.size()) != sequences * batch.max_pages) {
    fail("block_table",
         std::to_string(sequences) + " x " + std::to_string(batch.max_pages) + " entries",
         std::to_string(batch.block_table.size()));
  }
  for (Index s = 0; s < sequences; ++s) {
    const Index length = batch.seq_lens[s];
    const Index pages = (length + pool.page_size - 1) / pool.page_size;
    if (length < 0 || pages > batch.max_pages) {
      fail("seq_lens",
           "lengths from 0 to max_pages * page_size = " +
               std::to_string(batch.max_pages * pool.page_size),
           "seq_lens[" + std::to_string(s) + "] = " + std::to_string(length));
    }
    for (Index j = 0; j < pages; ++j) {
      const std::int32_t page = batch.block_table[s * batch.max_pages + j];
      if (page < 0 || page >= pool.pages) {
        fail("block_table",
             "pages in [0, " + std::to_string(pool.pages) + ") for the keys a sequence holds",
             "block_table[" + std::to_string(s) + ", " + std::to_string(j) +
                 "] = " + std::to_string(page));
      }
    }
  }
  return sequences;
}

// [1, Hq, T, d] -> [1, T, Hq, d]
Tensor tokens_first(const Tensor& by_head) {
  const Dims& shape = by_head.shape();
  const Index heads = shape[1], tokens = shape[2], d = shape[3];
  Tensor out(DType::f32, {1, tokens, heads, d});
  const float* from = by_head.data_as<float>();
  float* to = out.data_as<float>();
  for (Index h = 0; h < heads; ++h)
    for (Index t = 0; t < tokens; ++t)
      std::copy_n(from + (h * tokens + t) * d, d, to + (t * heads + h) * d);
  return out;
}

}  // namespace

PagedOutput paged_attention(const TensorView& q, const PagePool& keys, const PagePool& values,
                            const PagedBatch& batch, const Options& options, const Rotary& rotary) {
  api::check_pools(keys, values);
  core::check_float_dtype("q", q.dtype);
  if (q.shape[0] != 1 || q.shape[2] < 1 || q.shape[3] != keys.dim) {
    fail("q", "shape [1, total_q, Hq, " + std::to_string(keys.dim) + " (the key pool's dim)]",
         format_dims(q.shape));
  }
  const Index total_q = q.shape[1], heads_q = q.shape[2];
  if (heads_q % keys.heads_kv != 0) {
    fail("q",
         "a head count that is a multiple of the pools' " + std::to_string(keys.heads_kv) +
             " KV heads (GQA)",
         std::to_string(heads_q) + " heads");
  }
  core::check_storage("q", q);
  const Index sequences = check_batch(batch, total_q, keys);

  cpu::DecodeProblem p;
  api::set_step_options(p, options, heads_q, keys.heads_kv, keys.dim, values.dim,
                        "the batch says which keys a sequence has");
  api::set_paged_rows(p, q, keys, values, batch);
  core::check_rotary("rotary", rotary, keys.dim, total_q, false);
  if (rotary.style != RotaryStyle::none) {
    p.rotary = &rotary;
    for (Index s = 0; s < sequences; ++s)
      for (Index i = 0; i < p.queries(s); ++i) {
        const Index position = p.rotary_position(s, i);
        if (!core::has_position(rotary, keys.dim, position)) {
          fail("rotary.cos", "a row for every query's position (else give rotary.positions)",
               "no row for sequence " + std::to_string(s) + "'s query " + std::to_string(i) +
                   " at position " + std::to_string(position));
        }
      }
  }
  const State state = api::run_step(p, 1, total_q);
  const Finalized result = finalize(state, options.sinks);
  return {tokens_first(result.context), tokens_first(result.lse)};
}

}  // namespace attn
