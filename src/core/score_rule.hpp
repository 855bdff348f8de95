// What places a query among the keys and turns q.k into a score, beyond q and k themselves:
// one struct for the forward (and so backward) problem and the decode problem, which every
// kernel and the reference read. core::make_score_rule fills it from the caller's Options.
#pragma once

#include <optional>
#include <vector>

#include "attn/options.hpp"
#include "core/visible_keys.hpp"

namespace attn::core {

struct ScoreRule {
  double scale = 1.0;  // resolved: Options::scale, else 1/sqrt(head dim)
  bool causal = false;
  CausalAlign causal_align = CausalAlign::top_left;
  Index position_offset = 0;  // Options::position_offset
  Window window;
  double softcap = 0.0;
  std::vector<float> alibi_slopes;  // empty or [Hq]
  std::optional<PositionBias> position_bias;

  // Key position of query row i of a sequence of len_q queries over len_k keys, for the
  // alignment and the position offset: the one place that places a query among the keys.
  Index query_position(Index i, Index len_q, Index len_k) const {
    const Index aligned = causal_align == CausalAlign::bottom_right ? i + len_k - len_q : i;
    return aligned + position_offset;
  }
  // Keys [first, end) of [0, len_k) that causal and the window leave to the query at
  // key position `position`.
  KeyRange visible_keys(Index position, Index len_k) const {
    return core::visible_keys(causal, window, position, len_k);
  }
};

// The rule of `options` for queries and keys of head dim `dim` (the values are checked by
// check_options).
ScoreRule make_score_rule(const Options& options, Index dim);

}  // namespace attn::core
