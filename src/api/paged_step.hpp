// What attn::decode (over a KVCache) and attn::paged_attention (over the caller's pools)
// share above the paged kernel: the options a step takes, and running the kernel into an
// empty state; and the rows of a paged_attention call.
#pragma once

#include "attn/options.hpp"
#include "attn/paged.hpp"
#include "attn/state.hpp"
#include "cpu/decode/decode.hpp"

namespace attn::api {

// Refuses mask, cu_seqlens and the reference backend (with `why` the keys come from), checks
// the rest, and fills p's rule (bottom-right), threads and head counts.
void set_step_options(cpu::DecodeProblem& p, const Options& options, Index heads_q, Index heads_kv,
                      Index dim, Index dim_v, const char* keys_from);

// Where the kernel finds q's rows [1, total_q, Hq, D], the pools' pages and each sequence of
// a checked batch, and where it leaves each row's state: fills p's q, row places, pools,
// query starts, tables and lengths.
void set_paged_rows(cpu::DecodeProblem& p, const TensorView& q, const PagePool& keys,
                    const PagePool& values, const PagedBatch& batch);

// The kernel's state for `rows` rows per query head: [batch, Hq, rows / batch].
State run_step(const cpu::DecodeProblem& p, Index batch, Index rows_per_entry);

}  // namespace attn::api
