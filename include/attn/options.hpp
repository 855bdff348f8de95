// attn::Options: everything that changes which keys a query sees and how scores are shaped.
// Defaults mean "off", as in PyTorch and FlashAttention.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attn/block_mask.hpp"
#include "attn/position_bias.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Where query row i sits among the keys when Lq != Lk. top_left (PyTorch's is_causal):
// query i is at key position i. bottom_right (FlashAttention): query i is at key position
// i + Lk - Lq, so the last query sees the last key. The alignment applies to causal, the
// sliding window and ALiBi distances alike.
enum class CausalAlign : std::uint8_t { top_left, bottom_right };

enum class Backend : std::uint8_t {
  automatic,  // the fast CPU kernel when it supports the request, else the reference
  reference,  // the float64 oracle (slow; for checking and debugging)
  fast,       // the fast CPU kernel; throws if it does not support the request
};

// How the weights P enter the product P V. bf16 (the default): P rounded to bfloat16 once
// per weight (to nearest, ties to even) where P V runs on bf16 products, as PyTorch's,
// OpenVINO's and FlashAttention's kernels round it: AMX tiles (bf16 V), or AVX512-BF16's
// vdpbf16ps (bf16 V) on a CPU without AMX, and in decode and paged attention over a bf16
// cache, where the CPU's vdpbf16ps runs at the float32 FMA's rate or more (AMD's Zen 4 and 5;
// docs/architecture.md, "The plan"); each weight within 2^-8 of itself, at twice the float32
// rate or more. Against fp16 V on AMX tiles, whose outputs are finer than that, each weight
// as two bf16 parts (within 2^-15 of itself; 1.02-1.11x the exact forward on Emerald Rapids).
// Elsewhere, and for float32 V, P stays float32.
// exact: float32 P everywhere (on AMX tiles as three exact bf16 parts). The weights and lse
// outputs are exact either way.
enum class PvPrecision : std::uint8_t { exact, bf16 };

// Keys j with p - left <= j <= p + right are visible to the query at key position p; a
// negative bound means unbounded on that side.
struct Window {
  Index left = -1;
  Index right = -1;
};

struct Options {
  std::optional<double> scale;  // multiplies q.k; default 1/sqrt(head dim)
  bool causal = false;          // hide keys after the query's position
  CausalAlign causal_align = CausalAlign::top_left;
  // Added to every query's key position after the alignment: query i sits at key position
  // i + position_offset (top-left) or i + Lk - Lq + position_offset (bottom-right), for
  // causal, the window and ALiBi alike. It lets attention over a slice of a longer sequence
  // (a shard on another process, a chunk of a prompt) keep the positions of the whole.
  Index position_offset = 0;
  Window window;
  double softcap = 0.0;             // > 0: score = softcap * tanh(score / softcap)
  std::vector<float> alibi_slopes;  // [Hq]: score -= slope * |query position - key position|
  std::vector<float> sinks;         // [Hq]: an extra logit per head that takes weight, no value
  // A learned bias by relative position (attn/position_bias.hpp), added to the score after
  // softcap and ALiBi: score += table[head][column(query position - key position)].
  // attn::backward gives its table's gradient. Forward, weights and backward.
  std::optional<PositionBias> position_bias;
  // [B or 1, Hq or 1, Lq, Lk]. boolean: true means "may attend" (PyTorch's convention);
  // f16/bf16/f32/f64: added to the score (-inf hides the key).
  std::optional<TensorView> mask;
  // A boolean pattern by blocks (attn/block_mask.hpp), in place of mask: [B or 1, Hq or 1,
  // Lq, Lk], or with cu_seqlens [sequences or 1, Hq or 1, at least the longest sequence's
  // queries, at least its keys], each sequence read from its own first query and key.
  std::optional<BlockMask> block_mask;
  // Packed variable-length batches (flash_attn_varlen): q is [1, Hq, total_q, D], k and v
  // [1, Hkv, total_k, D]; sequence s owns rows cu_seqlens_q[s] .. cu_seqlens_q[s + 1] of q
  // and cu_seqlens_k[s] .. cu_seqlens_k[s + 1] of k and v. Both empty means "not packed".
  std::vector<std::int64_t> cu_seqlens_q;
  std::vector<std::int64_t> cu_seqlens_k;
  PvPrecision pv_precision = PvPrecision::bf16;
  // Dropout on the weights in P V, for training (PyTorch's and FlashAttention's dropout_p):
  // weight (b, h, i, j) is kept and scaled by 1 / (1 - dropout_p) with probability
  // 1 - dropout_p, else it is 0. Whether it is kept is a function of dropout_seed and
  // (b, h, i, j) alone (the rows and columns of q and k, packed ones too; attn/dropout.hpp),
  // so backward with the same options drops what forward dropped, on any thread count and
  // CPU. lse and the weights output stay those of the softmax before dropout. Forward and
  // backward only: decode and paged attention refuse it.
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0;
  Backend backend = Backend::automatic;  // ATTN_BACKEND=reference in the environment wins
  int threads = 0;                       // 0: ATTN_NUM_THREADS, else all cores
};

}  // namespace attn
