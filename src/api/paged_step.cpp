#include "api/paged_step.hpp"

#include <string>

#include "core/argument_checks.hpp"

namespace attn::api {

using core::fail;

void set_step_options(cpu::DecodeProblem& p, const Options& options, Index heads_q, Index heads_kv,
                      Index dim, Index dim_v, const char* keys_from) {
  if (options.mask) fail("mask", std::string("none (") + keys_from + ")", "a mask");
  if (!options.cu_seqlens_q.empty() || !options.cu_seqlens_k.empty()) {
    fail("cu_seqlens", std::string("none (") + keys_from + ")", "offsets");
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
}

State run_step(const cpu::DecodeProblem& p, Index batch, Index rows_per_entry) {
  State state = State::empty(DType::f32, batch, p.heads_q, rows_per_entry, p.dim_v);
  if (p.sequences() > 0 && batch * rows_per_entry > 0) cpu::decode(p, state);
  return state;
}

}  // namespace attn::api
