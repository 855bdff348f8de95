// attn::decode and attn::decode_state: argument checks (each naming its argument), then
// the decode kernel, then finalize with the sinks.
#include "attn/decode.hpp"

#include <cmath>
#include <string>

#include "api/paged_step.hpp"
#include "cache/page_rows.hpp"
#include "core/argument_checks.hpp"
#include "cpu/decode/decode.hpp"

namespace attn {
namespace {

using core::fail;

// reading: the sequences of seq_ids, held still until the kernel is done with them.
cpu::DecodeProblem make_problem(const TensorView& q, const KVCache& cache,
                                const std::vector<KVCache::SequenceId>& seq_ids,
                                const KVCache::Reading& reading, const Options& options) {
  const KVCacheConfig& config = cache.config();
  const auto sequences = static_cast<Index>(seq_ids.size());
  core::check_float_dtype("q", q.dtype);
  const std::string expected_q = "shape [" + std::to_string(sequences) +
                                 " (one per seq_id), Hq, n_q, " + std::to_string(config.dim) +
                                 " (the cache's dim)]";
  if (q.shape[0] != sequences || q.shape[1] < 1 || q.shape[2] < 0 || q.shape[3] != config.dim) {
    fail("q", expected_q, format_dims(q.shape));
  }
  if (q.shape[1] % config.heads_kv != 0) {
    fail("q",
         "a head count that is a multiple of the cache's " + std::to_string(config.heads_kv) +
             " KV heads (GQA)",
         std::to_string(q.shape[1]) + " heads");
  }
  core::check_storage("q", q);
  cpu::DecodeProblem p;
  api::set_step_options(p, options, q.shape[1], config.heads_kv, config.dim, config.dim_v,
                        "decode reads which keys a sequence has from the cache");
  const Index n_q = q.shape[2];
  p.q = q.data;
  p.q_dtype = q.dtype;
  p.q_rows.head_stride = q.strides[1];
  p.q_rows.token_stride = q.strides[2];
  p.state_rows.head_stride = n_q;
  p.state_rows.token_stride = 1;
  p.keys = cache::page_rows_of(cache, false);
  p.values = cache::page_rows_of(cache, true);
  p.query_start.push_back(0);
  for (std::size_t s = 0; s < seq_ids.size(); ++s) {
    const auto& table = reading.block_table(s);
    p.tables.emplace_back(table.data(), table.size());
    p.lengths.push_back(reading.length(s));
    p.query_start.push_back(p.query_start.back() + n_q);
    p.q_rows.seq_base.push_back(static_cast<Index>(s) * q.strides[0]);
    p.state_rows.seq_base.push_back(static_cast<Index>(s) * q.shape[1] * n_q);
  }
  return p;
}

}  // namespace

Decoded decode(const TensorView& q, const KVCache& cache,
               const std::vector<KVCache::SequenceId>& seq_ids, const Options& options) {
  const KVCache::Reading reading = cache.read(seq_ids, "seq_ids");
  const State state =
      api::run_step(make_problem(q, cache, seq_ids, reading, options), q.shape[0], q.shape[2]);
  Finalized result = finalize(state, options.sinks);
  return {std::move(result.context), std::move(result.lse)};
}

State decode_state(const TensorView& q, const KVCache& cache,
                   const std::vector<KVCache::SequenceId>& seq_ids, const Options& options) {
  if (!options.sinks.empty()) {
    fail("sinks", "none in decode_state (a state excludes sinks; pass them to finalize)",
         std::to_string(options.sinks.size()) + " values");
  }
  const KVCache::Reading reading = cache.read(seq_ids, "seq_ids");
  return api::run_step(make_problem(q, cache, seq_ids, reading, options), q.shape[0], q.shape[2]);
}

}  // namespace attn
