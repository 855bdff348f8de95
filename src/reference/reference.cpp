// Reference attention, one query row at a time:
//   s_j = softcap(scale * q.k_j) - slope * |p - j| + bias(p - j) + mask_ij   for each
//   visible key j, bias the position bias table's entry for the distance
//   m = max(s_j, sink);  l = sum_j exp(s_j - m) + exp(sink - m)
//   alpha_j = exp(s_j - m) / l;  C = sum_j alpha_j z_j v_j;  lse = m + log(l)
// z_j is dropout's factor (core/dropout.hpp): 1 without dropout, else 0 or 1 / (1 - p); the
// weights output is alpha, before dropout.
// Hidden keys are skipped, never multiplied by zero, so NaN in a hidden k or v row cannot
// reach the output. A row with no visible key and no sink gives C = 0 and lse = -inf.
#include "reference.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "core/dropout.hpp"
#include "core/rows.hpp"

namespace attn::reference {
namespace {

using core::Problem;
using core::Segment;

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

// Is key j (relative to the segment) visible to query row i, by causal, window, a boolean
// mask, an additive mask of -inf or a block mask? Decided before the score is computed: -inf + NaN
// is NaN, so a NaN key that an additive mask hides must never enter the dot product.
bool visible(const Problem& p, const Segment& seg, Index head, Index i, Index j) {
  const Index position = p.query_position(seg, i);
  if (p.rule.causal && j > position) return false;
  if (p.rule.window.left >= 0 && j < position - p.rule.window.left) return false;
  if (p.rule.window.right >= 0 && j > position + p.rule.window.right) return false;
  const Index mask_row = seg.q_begin + i, mask_col = seg.k_begin + j;
  if (p.mask_kind == core::MaskKind::boolean) {
    const auto mask = p.mask.as<bool>("mask");
    if (!mask(seg.batch, head, mask_row, mask_col)) return false;
  }
  if (p.mask_kind == core::MaskKind::additive &&
      core::load_element(p.mask, seg.batch, head, mask_row, mask_col) == kMinusInfinity) {
    return false;
  }
  return p.mask_kind != core::MaskKind::blocks || p.block_mask->shows(seg.sequence, head, i, j);
}

// The shaped score of key j, and in slope its derivative with respect to scale * q.k (the
// softcap's 1 - tanh^2; ALiBi, the position bias and an additive mask do not depend on q
// or k).
double score(const Problem& p, const Segment& seg, Index head, Index i, Index j,
             const std::vector<double>& q_row, std::vector<double>& k_row, double& slope) {
  core::load_row(p.k, seg.batch, head / p.group_size(), seg.k_begin + j, k_row.data());
  double dot = 0.0;
  for (Index d = 0; d < p.dim_qk; ++d) dot += q_row[d] * k_row[d];
  double s = dot * p.rule.scale;
  slope = 1.0;
  if (p.rule.softcap > 0.0) {
    const double t = std::tanh(s / p.rule.softcap);
    s = p.rule.softcap * t;
    slope = 1.0 - t * t;
  }
  if (!p.rule.alibi_slopes.empty()) {
    const auto distance = static_cast<double>(std::abs(p.query_position(seg, i) - j));
    s -= static_cast<double>(p.rule.alibi_slopes[head]) * distance;
  }
  if (p.rule.position_bias) {
    s += static_cast<double>(bias_of(*p.rule.position_bias, head, p.query_position(seg, i) - j));
  }
  if (p.mask_kind == core::MaskKind::additive) {
    s += core::load_element(p.mask, seg.batch, head, seg.q_begin + i, seg.k_begin + j);
  }
  return s;
}

void attend_row(const Problem& p, const Segment& seg, Index head, Index i, RowScratch& scratch,
                std::vector<double>& v_row, std::vector<double>& out_row) {
  const Index b = seg.batch, row = seg.q_begin + i, kv_head = head / p.group_size();
  const double lse = row_weights(p, seg, head, i, scratch);
  const core::DropoutRow drop = core::dropout_row(p.dropout.seed, b, head, row);
  std::fill(out_row.begin(), out_row.end(), 0.0);
  for (Index j = 0; j < seg.len_k; ++j) {
    if (!scratch.shown[j]) continue;
    const double z = p.dropout.on() ? p.dropout.factor(drop, seg.k_begin + j) : 1.0;
    core::load_row(p.v, b, kv_head, seg.k_begin + j, v_row.data());
    for (Index d = 0; d < p.dim_v; ++d) out_row[d] += scratch.weights[j] * z * v_row[d];
  }
  core::store_row(p.outputs.context, b, head, row, out_row.data());

  if (p.outputs.lse) core::store_row(*p.outputs.lse, b, head, row, &lse);
  if (p.outputs.weights) {
    // Packed sequences: the row covers all packed keys, zero outside this sequence.
    std::vector<double>& packed = scratch.packed;
    packed.assign(static_cast<std::size_t>(p.total_k), 0.0);
    for (Index j = 0; j < seg.len_k; ++j) {
      if (scratch.shown[j]) packed[seg.k_begin + j] = scratch.weights[j];
    }
    core::store_row(*p.outputs.weights, b, head, row, packed.data());
  }
}

}  // namespace

double row_weights(const Problem& p, const Segment& seg, Index head, Index i, RowScratch& scratch) {
  scratch.q_row.resize(static_cast<std::size_t>(p.dim_qk));
  scratch.k_row.resize(static_cast<std::size_t>(p.dim_qk));
  scratch.weights.assign(static_cast<std::size_t>(seg.len_k), 0.0);
  scratch.shown.assign(static_cast<std::size_t>(seg.len_k), 0);
  scratch.score_slopes.assign(static_cast<std::size_t>(seg.len_k), 0.0);
  std::vector<double>& scores = scratch.weights;
  std::vector<char>& shown = scratch.shown;
  core::load_row(p.q, seg.batch, head, seg.q_begin + i, scratch.q_row.data());

  const double sink = p.sinks.empty() ? kMinusInfinity : static_cast<double>(p.sinks[head]);
  double m = sink;  // max is subtracted only for numerical stability
  for (Index j = 0; j < seg.len_k; ++j) {
    shown[j] = visible(p, seg, head, i, j);
    if (!shown[j]) continue;
    scores[j] = score(p, seg, head, i, j, scratch.q_row, scratch.k_row, scratch.score_slopes[j]);
    if (scores[j] == kMinusInfinity) shown[j] = false;  // takes no weight
    // A NaN score makes m NaN, so the row's outputs are NaN: a NaN the query sees must not
    // pass for a fully masked row (zeros, lse = -inf).
    if (shown[j] && (scores[j] > m || std::isnan(scores[j]))) m = scores[j];
  }
  if (m == kMinusInfinity) {
    std::fill(scores.begin(), scores.end(), 0.0);
    return kMinusInfinity;
  }
  double l = sink != kMinusInfinity ? std::exp(sink - m) : 0.0;
  for (Index j = 0; j < seg.len_k; ++j) {
    scores[j] = shown[j] ? std::exp(scores[j] - m) : 0.0;
    l += scores[j];
  }
  for (Index j = 0; j < seg.len_k; ++j) {
    if (shown[j]) scores[j] /= l;
  }
  return m + std::log(l);
}

void forward(const Problem& p) {
  std::vector<double> v_row(p.dim_v), out_row(p.dim_v);
  RowScratch scratch;
  for (const Segment& seg : p.segments) {
    for (Index head = 0; head < p.heads_q; ++head) {
      for (Index i = 0; i < seg.len_q; ++i) attend_row(p, seg, head, i, scratch, v_row, out_row);
    }
  }
}

}  // namespace attn::reference
