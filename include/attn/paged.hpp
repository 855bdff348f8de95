// attn::paged_attention: attention over key/value pages the caller owns, as serving engines
// hold them (vLLM, FlashAttention's block_table, FlashInfer, transformers' continuous
// batching). One call serves a ragged batch: each sequence brings its own number of new
// queries (a prefill chunk, one decode token, a speculative draft, or none) and reads its
// keys through its row of a page table. The pools are read in place; nothing is copied.
// attn::decode over attn's own KVCache runs the same kernel.
//
// Batch invariance: the bits of a sequence's outputs depend only on its own queries, keys,
// values and the options. They do not depend on the other sequences of the call, their
// order or query counts, the thread count, the page size or layout of the pools, nor on
// how a prompt is cut into prefill chunks: a query's context and lse are the same bytes
// whether its chunk held 1, 7, 64 queries or the whole prompt (on one CPU target; another
// target sums in another order).
#pragma once

#include <cstdint>
#include <span>

#include "attn/kv_cache.hpp"
#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Where a pool keeps the row of (page, slot, KV head).
enum class PageLayout : std::uint8_t {
  token_major,  // [pages, page_size, Hkv, dim]: vLLM, FlashAttention's paged k_cache
  head_major,   // [pages, Hkv, page_size, dim]: FlashInfer's HND, attn's own KVCache
};

const char* page_layout_name(PageLayout layout);

// One pool of the caller's pages, keys or values: pages * page_size * heads_kv * dim
// elements of dtype, contiguous in `layout`. Read in place by paged_attention, written in
// place by append_pages.
struct PagePool {
  void* data = nullptr;
  CacheDType dtype = CacheDType::f16;
  PageLayout layout = PageLayout::token_major;
  Index pages = 0, page_size = 0, heads_kv = 0, dim = 0;
  // int8 and int4 only: float32, one per token and KV head, an element being its code * its
  // row's scale (as KVCache's): [pages, page_size, heads_kv] for token_major pools,
  // [pages, heads_kv, page_size] for head_major ones (the pool's layout without dim); with
  // group > 0 (32, 64 or 128 dividing dim, as KVCacheConfig::group), one per group of
  // `group` elements of each row: [pages, page_size, heads_kv, dim / group] or
  // [pages, heads_kv, page_size, dim / group].
  // With zero_point, each scale is a (scale, offset) pair, [..., 2], an element being its
  // code * scale + offset (asymmetric codes, as KVCacheConfig::zero_point). Key and value
  // pools of one dtype agree on zero_point, and symmetric int8 pools on group (int4 and zero
  // points read each side with its own). The key and value pools may hold two dtypes
  // (llama.cpp's type_k and type_v: K and V tolerate different formats), each with its own
  // scales, group and zero_point; the kernel then widens each tile's values to float32 by
  // their own format, once per tile.
  // fp8 only, optional: float32, one per KV head, [heads_kv], positive and finite, an element
  // being its code * its head's scale (vLLM's k_scale and v_scale, per head); null for 1.
  float* scales = nullptr;
  Index group = 0;
  bool zero_point = false;
};

// attn's own KVCache as paged_attention's pools, read in place: head-major pools of the
// cache's max_blocks pages (keys of its dim and dtype, values of its dim_v and dtype_v and,
// for int8 and int4, their scales, group and zero_point), block numbers being page numbers, so a
// sequence's KVCache::block_table (or a KVCache::Reading's) is its row of a PagedBatch's table and
// its length its seq_len. Only for a cache made with max_blocks > 0, whose blocks lie in one
// allocation (reserved here if no append has yet); else throws attn::Error naming max_blocks. The
// pools stay valid as long as the cache; write them through KVCache::append only (append_pages
// would not update lengths, shared blocks or int8 scales), and append to or drop a sequence only
// when no paged_attention call is reading it.
struct CachePools {
  PagePool keys, values;
};
CachePools cache_pools(KVCache& cache);

// Which sequences a call serves, all int32 as engines hold them.
struct PagedBatch {
  // [S + 1]: sequence s's queries are rows query_start[s] .. query_start[s + 1] of q, its
  // newest tokens (bottom-right): query i of n_q sits at key position seq_lens[s] - n_q + i
  // (plus Options::position_offset). 0 queries: the sequence only holds keys this call.
  std::span<const std::int32_t> query_start;
  // [S]: keys of each sequence, the new tokens' included (append them first).
  std::span<const std::int32_t> seq_lens;
  // [S, max_pages], row-major: sequence s's token t lives in page block_table[s, t /
  // page_size] at slot t % page_size. Pages may be shared between sequences and come in
  // any order; entries past a sequence's last page are not read.
  std::span<const std::int32_t> block_table;
  Index max_pages = 0;
};

// Rotary position embedding, applied where keys are appended (append_pages) and where
// queries are scored (paged_attention): the first `dims` elements of a row at position p
// are rotated by the angles whose cosines and sines are row p of the caller's tables (so
// the frequencies, and llama3 / YaRN scaling, are the caller's choice). Pairs are (x[j],
// x[j + dims / 2]) in the NeoX (half-split) style, (x[2j], x[2j + 1]) in the GPT-J
// (interleaved) style: x' = x cos - y sin, y' = y cos + x sin, in float64, then rounded
// once (to the pool's dtype for a key, to float32 for a query). The rest of the row is
// left as it is (partial rotary).
enum class RotaryStyle : std::uint8_t { none, neox, interleaved };

struct Rotary {
  RotaryStyle style = RotaryStyle::none;
  Index dims = 0;  // rotated elements, even; 0: the whole head dim
  // [positions, dims / 2] float32, row-major: row p for position p.
  std::span<const float> cos, sin;
  // A position per row: per new token for append_pages (required), per query row for
  // paged_attention (optional: else each query's key position, the position offset included).
  std::span<const std::int32_t> positions;
};

struct PagedOutput {
  Tensor context;  // [1, total_q, Hq, Dv] float32
  Tensor lse;      // [1, total_q, Hq, 1] float32, sinks included; -inf for a row that sees no key
};

// q: [1, total_q, Hq, D] (any float dtype, any strides with a contiguous last dim), D = the
// key pool's dim, Hq a multiple of its heads_kv (GQA/MQA). A query at a negative position
// (more queries than keys) sees no key under causal: context 0, lse -inf. Options: scale,
// causal, window, softcap, alibi_slopes, sinks, position_offset and threads apply as in
// attn::decode; mask and cu_seqlens are refused (the batch says which keys a sequence has),
// causal_align is bottom-right whatever it says, backend must be automatic or fast. A bad
// argument throws attn::Error naming it (a page index past the pool, a sequence longer than
// its table, ...).
// rotary: the queries are rotated at their positions before they are scored (the keys
// were rotated when they were appended).
PagedOutput paged_attention(const TensorView& q, const PagePool& keys, const PagePool& values,
                            const PagedBatch& batch, const Options& options = {},
                            const Rotary& rotary = {});

// Writes new tokens' keys and values into the pools, in place: token i goes to page
// slots[i] / page_size at slot slots[i] % page_size (vLLM's slot_mapping); a negative slot
// skips the token (padding). k: [1, n, Hkv, D]  v: [1, n, Hkv, Dv] (engines' [tokens, heads,
// dim]; any float dtype, any strides with a contiguous last dim), rounded to the pools'
// dtype. int8, int4: each token's row (or group) of each KV head is quantised once with its
// own scale (and offset, zero_point) as KVCache, so slots may be filled in any order; fp8: each
// element rounded alone. A slot past the pool or given twice, a bad shape, or a value that is not
// finite for int8, int4 or fp8 throws attn::Error naming the argument, and nothing is written.
// rotary: the keys are rotated at rotary.positions (one per token) before they are stored.
void append_pages(const TensorView& k, const TensorView& v, std::span<const std::int64_t> slots,
                  const PagePool& keys, const PagePool& values, const Rotary& rotary = {});

}  // namespace attn
