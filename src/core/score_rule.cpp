#include "core/score_rule.hpp"

#include "core/argument_checks.hpp"

namespace attn::core {

ScoreRule make_score_rule(const Options& options, Index dim) {
  ScoreRule rule;
  rule.scale = resolved_scale(options, dim);
  rule.causal = options.causal;
  rule.causal_align = options.causal_align;
  rule.position_offset = options.position_offset;
  rule.window = options.window;
  rule.softcap = options.softcap;
  rule.alibi_slopes = options.alibi_slopes;
  rule.position_bias = options.position_bias;
  return rule;
}

}  // namespace attn::core
