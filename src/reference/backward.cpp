// Reference backward, one query row at a time, from the forward reference's weights
// (row_weights: the same visibility and score rules):
//   P_j = alpha_j;  dP_j = z_j dO . v_j;  D = sum_j P_j dP_j (= dO . O)
//   dS_j = P_j (dP_j - D);  dx_j = dS_j * d score_j / d x_j   with x_j = scale q.k_j
//   dq += scale dx_j k_j;  dk_j += scale dx_j q;  dv_j += P_j z_j dO
// z_j is dropout's factor for the weight, as forward applied it (1 without dropout).
//   dsink = -P_sink D      (the sink is a logit with no value: its dP is 0)
//   dtable[head][column(p - j)] += dS_j   (the position bias is added to the score itself)
// d score / d x is the softcap's 1 - tanh^2; ALiBi, masks and the scale take no gradient.
// Hidden keys are skipped, so a NaN in a hidden k or v row never reaches a gradient.
#include "reference/backward.hpp"

#include <cmath>
#include <vector>

#include "core/dropout.hpp"
#include "core/rows.hpp"
#include "reference/reference.hpp"

namespace attn::reference {
namespace {

using core::Segment;

// A [B, H, L, D] float64 buffer that gradients are summed into before the final rounding.
struct Sums {
  explicit Sums(const Dims& dims)
      : shape(dims), values(static_cast<std::size_t>(dims[0] * dims[1] * dims[2] * dims[3])) {}
  double* row(Index b, Index h, Index s) {
    return values.data() + ((b * shape[1] + h) * shape[2] + s) * shape[3];
  }
  void store(const MutableTensorView& t) {
    for (Index b = 0; b < shape[0]; ++b)
      for (Index h = 0; h < shape[1]; ++h)
        for (Index s = 0; s < shape[2]; ++s) core::store_row(t, b, h, s, row(b, h, s));
  }
  Dims shape;
  std::vector<double> values;
};

}  // namespace

void backward(const core::BackwardProblem& bp) {
  const core::Problem& p = bp.forward;
  Sums dq(bp.dq.shape), dk(bp.dk.shape), dv(bp.dv.shape);
  std::vector<double> dsinks(static_cast<std::size_t>(p.heads_q), 0.0);
  const std::optional<PositionBias>& bias = p.rule.position_bias;
  const Index bias_heads = bias ? static_cast<Index>(bias->table.size()) / bias->columns : 0;
  std::vector<double> dtable(bias ? bias->table.size() : 0, 0.0);
  std::vector<double> dout(p.dim_v), v_row(p.dim_v), k_row(p.dim_qk), dp;
  RowScratch scratch;
  for (const Segment& seg : p.segments) {
    dp.assign(static_cast<std::size_t>(seg.len_k), 0.0);
    for (Index head = 0; head < p.heads_q; ++head) {
      const Index b = seg.batch, kv_head = head / p.group_size();
      for (Index i = 0; i < seg.len_q; ++i) {
        const Index row = seg.q_begin + i;
        const double lse = row_weights(p, seg, head, i, scratch);
        if (lse == -INFINITY) continue;  // no key, no sink: every weight is 0
        const std::vector<double>& weights = scratch.weights;
        const core::DropoutRow drop = core::dropout_row(p.dropout.seed, b, head, row);
        core::load_row(bp.dout, b, head, row, dout.data());
        double d_sum = 0.0;
        for (Index j = 0; j < seg.len_k; ++j) {
          if (!scratch.shown[j]) continue;
          const double z = p.dropout.on() ? p.dropout.factor(drop, seg.k_begin + j) : 1.0;
          core::load_row(p.v, b, kv_head, seg.k_begin + j, v_row.data());
          double dot = 0.0;
          for (Index d = 0; d < p.dim_v; ++d) dot += dout[d] * v_row[d];
          dp[j] = z * dot;
          d_sum += weights[j] * dp[j];
          double* dv_row = dv.row(b, kv_head, seg.k_begin + j);
          for (Index d = 0; d < p.dim_v; ++d) dv_row[d] += weights[j] * z * dout[d];
        }
        if (!p.sinks.empty()) {
          dsinks[head] -= std::exp(static_cast<double>(p.sinks[head]) - lse) * d_sum;
        }
        double* dq_row = dq.row(b, head, row);
        double* dtable_row =
            bias ? dtable.data() + (bias_heads == 1 ? 0 : head) * bias->columns : nullptr;
        for (Index j = 0; j < seg.len_k; ++j) {
          if (!scratch.shown[j]) continue;
          const double ds = weights[j] * (dp[j] - d_sum);
          if (bias) dtable_row[bias_column(*bias, p.query_position(seg, i) - j)] += ds;
          const double dx = ds * scratch.score_slopes[j] * p.rule.scale;
          core::load_row(p.k, b, kv_head, seg.k_begin + j, k_row.data());
          double* dk_row = dk.row(b, kv_head, seg.k_begin + j);
          for (Index d = 0; d < p.dim_qk; ++d) {
            dq_row[d] += dx * k_row[d];
            dk_row[d] += dx * scratch.q_row[d];
          }
        }
      }
    }
  }
  dq.store(bp.dq);
  dk.store(bp.dk);
  dv.store(bp.dv);
  if (bp.dsinks) {
    for (Index h = 0; h < p.heads_q; ++h) core::store_row(*bp.dsinks, 0, h, 0, &dsinks[h]);
  }
  for (Index h = 0; h < bias_heads; ++h) {
    core::store_row(*bp.dposition_bias, 0, h, 0, dtable.data() + h * bias->columns);
  }
}

}  // namespace attn::reference
