// attn::decode and attn::decode_state: argument checks (each naming its argument), then
// the decode kernel, then finalize with the sinks.
#include "attn/decode.hpp"

#include <cmath>
#include <string>

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
                                 " (one per seq_id), Hq, n_q >= 1, " + std::to_string(config.dim) +
                                 " (the cache's dim)]";
  if (q.shape[0] != sequences || q.shape[1] < 1 || q.shape[2] < 1 || q.shape[3] != config.dim) {
    fail("q", expected_q, format_dims(q.shape));
  }
  if (q.shape[1] % config.heads_kv != 0) {
    fail("q",
         "a head count that is a multiple of the cache's " + std::to_string(config.heads_kv) +
             " KV heads (GQA)",
         std::to_string(q.shape[1]) + " heads");
  }
  core::check_storage("q", q);
  if (options.mask)
    fail("mask", "none (decode reads which keys a sequence has from the cache)", "a mask");
  if (!options.cu_seqlens_q.empty() || !options.cu_seqlens_k.empty()) {
    fail("cu_seqlens", "none (decode takes sequences from the cache)", "offsets");
  }
  if (options.backend == Backend::reference) {
    fail("backend", "automatic or fast (decode has one kernel)", "reference");
  }
  core::check_options(options, q.shape[1]);

  cpu::DecodeProblem p;
  p.q = q;
  p.cache = &cache;
  for (std::size_t s = 0; s < seq_ids.size(); ++s) {
    const Index length = reading.length(s);
    if (length + options.position_offset < q.shape[2]) {
      fail("seq_ids",
           "sequences holding at least n_q = " + std::to_string(q.shape[2]) +
               " tokens, position_offset included (append the new keys and values before "
               "decoding)",
           "sequence " + std::to_string(seq_ids[s]) + " of " + std::to_string(length));
    }
    p.tables.push_back(&reading.block_table(s));
    p.lengths.push_back(length);
  }
  p.heads_q = q.shape[1];
  p.heads_kv = config.heads_kv;
  p.dim = config.dim;
  p.dim_v = config.dim_v;
  p.queries = q.shape[2];
  p.rule = core::make_score_rule(options, config.dim);
  p.rule.causal_align = CausalAlign::bottom_right;
  p.threads = options.threads;
  return p;
}

State run(const cpu::DecodeProblem& p) {
  State state = State::empty(DType::f32, p.sequences(), p.heads_q, p.queries, p.dim_v);
  if (p.sequences() > 0) cpu::decode(p, state);
  return state;
}

}  // namespace

Decoded decode(const TensorView& q, const KVCache& cache,
               const std::vector<KVCache::SequenceId>& seq_ids, const Options& options) {
  const KVCache::Reading reading = cache.read(seq_ids, "seq_ids");
  const State state = run(make_problem(q, cache, seq_ids, reading, options));
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
  return run(make_problem(q, cache, seq_ids, reading, options));
}

}  // namespace attn
