// What attn::decode (over a KVCache) and attn::paged_attention (over the caller's pools)
// share above the paged kernel: the options a step takes, and running the kernel into an
// empty state.
#pragma once

#include "attn/options.hpp"
#include "attn/state.hpp"
#include "cpu/decode/decode.hpp"

namespace attn::api {

// Refuses mask, cu_seqlens and the reference backend (with `why` the keys come from), checks
// the rest, and fills p's rule (bottom-right), threads and head counts.
void set_step_options(cpu::DecodeProblem& p, const Options& options, Index heads_q, Index heads_kv,
                      Index dim, Index dim_v, const char* keys_from);

// The kernel's state for `rows` rows per query head: [batch, Hq, rows / batch].
State run_step(const cpu::DecodeProblem& p, Index batch, Index rows_per_entry);

}  // namespace attn::api
