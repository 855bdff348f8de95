#include "api/paged_step.hpp"

#include <string>

#include "api/page_pools.hpp"
#include "core/argument_checks.hpp"

namespace attn::api {

using core::fail;

void set_step_options(cpu::DecodeProblem& p, const Options& options, Index heads_q, Index heads_kv,
                      Index dim, Index dim_v, const char* keys_from) {
  if (options.mask) fail("mask", std::string("none (") + keys_from + ")", "a mask");
  if (options.block_mask) {
    fail("block_mask", std::string("none (") + keys_from + ")", "a block mask");
  }
  if (options.position_bias) {
    fail("position_bias", "none (decode and paged attention do not take one)", "a position bias");
  }
  if (!options.cu_seqlens_q.empty() || !options.cu_seqlens_k.empty()) {
    fail("cu_seqlens", std::string("none (") + keys_from + ")", "offsets");
  }
  if (options.dropout_p != 0.0) {
    fail("dropout_p", "0 (decode and paged attention serve inference)",
         std::to_string(options.dropout_p));
  }
  if (options.backend == Backend::reference) {
    fail("backend", "automatic or fast (paged attention has one kernel)", "reference");
  }
  core::check_options(options, heads_q);
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.dim = dim;
  p.dim_v = dim_v;
  p.rule = core::make_score_rule(options, dim);
  p.rule.causal_align = CausalAlign::bottom_right;
  p.threads = options.threads;
  p.pv_precision = options.pv_precision;
}

void set_paged_rows(cpu::DecodeProblem& p, const TensorView& q, const PagePool& keys,
                    const PagePool& values, const PagedBatch& batch) {
  const Index total_q = q.shape[1];
  const auto sequences = static_cast<Index>(batch.seq_lens.size());
  p.q = q.data;
  p.q_dtype = q.dtype;
  p.q_rows.head_stride = q.strides[2];
  p.q_rows.token_stride = q.strides[1];
  p.state_rows.head_stride = total_q;
  p.state_rows.token_stride = 1;
  p.keys = rows_of(keys);
  p.values = rows_of(values);
  for (Index s = 0; s <= sequences; ++s) p.query_start.push_back(batch.query_start[s]);
  for (Index s = 0; s < sequences; ++s) {
    p.tables.push_back(batch.block_table.subspan(static_cast<std::size_t>(s * batch.max_pages),
                                                 static_cast<std::size_t>(batch.max_pages)));
    p.lengths.push_back(batch.seq_lens[s]);
    p.q_rows.seq_base.push_back(batch.query_start[s] * q.strides[1]);
    p.state_rows.seq_base.push_back(batch.query_start[s]);
  }
}

State run_step(const cpu::DecodeProblem& p, Index batch, Index rows_per_entry) {
  State state = State::empty(DType::f32, batch, p.heads_q, rows_per_entry, p.dim_v);
  if (p.sequences() > 0 && batch * rows_per_entry > 0) cpu::decode(p, state);
  return state;
}

}  // namespace attn::api
