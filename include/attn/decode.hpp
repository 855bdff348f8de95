// attn::decode: a generation step. Each sequence's newest queries attend over its keys in
// an attn::KVCache. The cost is reading the cache, so the kernel streams each K/V block
// once per step, converting 16-bit, int8, int4 and fp8 elements to float32 in registers
// (codes with a scale per group times it there too); long
// sequences are split along the keys into fixed chunks worked on by all threads and merged
// with the state merge in key order (flash-decoding), so results are bitwise identical for
// any thread count. Sequences that share a prompt prefix (KVCache::fork) read the shared
// blocks once per call for all of them.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/kv_cache.hpp"
#include "attn/options.hpp"
#include "attn/state.hpp"
#include "attn/tensor.hpp"

namespace attn {

// q: [S, Hq, n_q, D] for the S sequences seq_ids (any float dtype, any strides with a
// contiguous last dim); D = the cache's dim; Hq a multiple of its heads_kv (GQA/MQA).
// The n_q queries of a sequence are its last n_q tokens, whose keys and values were
// appended first: query i sits at key position length - n_q + i (bottom-right alignment,
// whatever options.causal_align says), plus options.position_offset (a cache holding one
// range of a longer context, a shard on another process, passes the number of keys that
// come after its range). n_q > 1 serves speculative decoding: with options.causal each new
// query sees the keys up to its own position only; a query at a negative position sees no
// key under causal (context 0, lse -inf), and an empty sequence gives every row 0 and -inf.
// Options: scale, causal, window, softcap, alibi_slopes, sinks and threads apply as in
// forward; mask and cu_seqlens are refused (the cache says which keys each sequence has);
// backend must be automatic or fast. This is attn::paged_attention (attn/paged.hpp) over the
// cache's own pages, with its batch invariance.
struct Decoded {
  Tensor context;  // [S, Hq, n_q, Dv] float32
  Tensor lse;      // [S, Hq, n_q, 1] float32, sinks included
};
Decoded decode(const TensorView& q, const KVCache& cache,
               const std::vector<KVCache::SequenceId>& seq_ids, const Options& options = {});

// The same step as a float32 State (sinks refused, as for forward_state), to merge with
// attention over keys held elsewhere.
State decode_state(const TensorView& q, const KVCache& cache,
                   const std::vector<KVCache::SequenceId>& seq_ids, const Options& options = {});

}  // namespace attn
