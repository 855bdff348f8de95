// A validated attention request: every kernel (reference or fast) receives a Problem, so
// argument checking happens once, before any work.
#pragma once

#include <vector>

#include "attn/attention.hpp"
#include "attn/options.hpp"
#include "attn/tensor.hpp"
#include "core/dropout.hpp"
#include "core/position_bias.hpp"
#include "core/score_rule.hpp"

namespace attn::core {

enum class MaskKind : std::uint8_t { none, boolean, additive, blocks };

// One independent attention problem inside the batch: queries
// [q_begin, q_begin + len_q) against keys [k_begin, k_begin + len_k) of batch entry `batch`.
// A plain batch has one segment per batch entry; a packed varlen batch one per sequence.
struct Segment {
  Index batch = 0;
  Index q_begin = 0;
  Index len_q = 0;
  Index k_begin = 0;
  Index len_k = 0;
  Index sequence = 0;  // its batch entry, or its packed sequence: its entry of a block mask
};

struct Problem {
  TensorView q, k, v;
  Index batch = 0, heads_q = 0, heads_kv = 0, dim_qk = 0, dim_v = 0;
  Index total_q = 0, total_k = 0;  // rows of q and of k/v per (batch, head)
  std::vector<Segment> segments;
  bool packed = false;

  ScoreRule rule;  // scale, causal and its alignment, offset, window, softcap, ALiBi, bias
  BiasByOffset bias_by_offset;  // rule.position_bias as the fast kernels read it, or empty
  std::vector<float> sinks;     // empty or [Hq]

  MaskKind mask_kind = MaskKind::none;
  TensorView mask;                        // strides of broadcast dims set to 0
  const BlockMask* block_mask = nullptr;  // mask_kind blocks: Options::block_mask
  Outputs outputs;
  int threads = 0;  // Options::threads: 0 means ATTN_NUM_THREADS, else every core
  PvPrecision pv_precision = PvPrecision::bf16;
  Dropout dropout;  // of P in P V (forward and backward); off by default

  Index group_size() const { return heads_q / heads_kv; }
  // Key position of query row i (relative to its segment): the rule's, for its lengths.
  Index query_position(const Segment& segment, Index i) const {
    return rule.query_position(i, segment.len_q, segment.len_k);
  }
};

// Checks shapes, dtypes, strides and option values; throws attn::Error naming the argument.
Problem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                     const Options& options);
// Checks that the outputs have the shapes the problem gives them, then records them.
void attach_outputs(Problem& problem, const Outputs& outputs);

}  // namespace attn::core
