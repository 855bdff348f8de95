// The lesson's three steps (attn::scores, attn::softmax, attn::context) in float64 loops.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/lesson.hpp"
#include "core/argument_checks.hpp"
#include "core/rows.hpp"

namespace attn {
namespace {

using core::fail;

void check_float(const char* name, const TensorView& t) {
  core::check_float_dtype(name, t.dtype);
  for (const Index extent : t.shape) {
    if (extent < 0) fail(name, "non-negative extents", "shape " + format_dims(t.shape));
  }
  core::check_storage(name, t);
}

void check_heads(const char* name, Index heads, Index heads_q) {
  if (heads < 1 || heads_q % heads != 0) {
    fail(name, "a head count dividing the " + std::to_string(heads_q) + " query heads",
         std::to_string(heads) + " heads");
  }
}

// 2^-(mantissa bits + 1): the largest relative error of rounding to `dtype`.
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return 0x1p-11;
    case DType::bf16:
      return 0x1p-8;
    case DType::f32:
      return 0x1p-24;
    default:
      return 0x1p-53;
  }
}

// A [1, 1, rows, cols] parameter matrix as a dense row-major double array.
std::vector<double> load_matrix(const char* name, const std::optional<TensorView>& t, Index rows,
                                Index cols) {
  if (!t)
    fail(name, "a [1, 1, " + std::to_string(rows) + ", " + std::to_string(cols) + "] matrix",
         "none");
  check_float(name, *t);
  const Dims wanted{1, 1, rows, cols};
  if (t->shape != wanted) fail(name, "shape " + format_dims(wanted), format_dims(t->shape));
  std::vector<double> out(static_cast<std::size_t>(rows * cols));
  for (Index r = 0; r < rows; ++r) core::load_row(*t, 0, 0, r, out.data() + r * cols);
  return out;
}

// y = W x for a row-major [rows, cols] W.
std::vector<double> multiply(const std::vector<double>& w, Index rows, Index cols,
                             const std::vector<double>& x) {
  std::vector<double> y(static_cast<std::size_t>(rows), 0.0);
  for (Index r = 0; r < rows; ++r)
    for (Index c = 0; c < cols; ++c) y[r] += w[r * cols + c] * x[c];
  return y;
}

}  // namespace

Tensor scores(const TensorView& q, const TensorView& k, const ScoreParams& params) {
  check_float("q", q);
  check_float("k", k);
  if (k.shape[0] != q.shape[0])
    fail("k", "batch " + std::to_string(q.shape[0]) + " (as q)", format_dims(k.shape));
  check_heads("k", k.shape[1], q.shape[1]);
  const Index batch = q.shape[0], heads = q.shape[1], len_q = q.shape[2], len_k = k.shape[2];
  const Index dim_q = q.shape[3], dim_k = k.shape[3], group = heads / k.shape[1];
  const bool needs_same_dim = params.kind == ScoreKind::dot || params.kind == ScoreKind::scaled_dot;
  if (needs_same_dim && dim_k != dim_q) {
    fail("k", "head dim " + std::to_string(dim_q) + " (as q)", format_dims(k.shape));
  }
  if (params.scale && params.kind != ScoreKind::scaled_dot) {
    fail("scale", "no scale (only scaled_dot scores take one)", std::to_string(*params.scale));
  }
  if (params.scale && !std::isfinite(*params.scale))
    fail("scale", "a finite number", std::to_string(*params.scale));

  double scale = 1.0;
  if (params.kind == ScoreKind::scaled_dot) {
    scale = params.scale ? *params.scale : 1.0 / std::sqrt(static_cast<double>(dim_q));
  }
  std::vector<double> bilinear, w1, w2, energy;
  Index hidden = 0;
  if (params.kind == ScoreKind::general)
    bilinear = load_matrix("weight", params.weight, dim_q, dim_k);
  if (params.kind == ScoreKind::additive) {
    if (!params.energy) fail("energy", "a [1, 1, 1, A] vector", "none");
    hidden = params.energy->shape[3];
    energy = load_matrix("energy", params.energy, 1, hidden);
    w1 = load_matrix("query_projection", params.query_projection, hidden, dim_q);
    w2 = load_matrix("key_projection", params.key_projection, hidden, dim_k);
  }

  Tensor out(q.dtype, {batch, heads, len_q, len_k});
  std::vector<double> q_row(dim_q), k_row(dim_k), s_row(len_k);
  for (Index b = 0; b < batch; ++b) {
    for (Index h = 0; h < heads; ++h) {
      for (Index i = 0; i < len_q; ++i) {
        core::load_row(q, b, h, i, q_row.data());
        // Bilinear: q^T W k = (W^T q) . k; additive: W1 q is shared by every key.
        std::vector<double> projected_q;
        if (params.kind == ScoreKind::general) {
          projected_q.assign(dim_k, 0.0);
          for (Index r = 0; r < dim_q; ++r)
            for (Index c = 0; c < dim_k; ++c) projected_q[c] += q_row[r] * bilinear[r * dim_k + c];
        } else if (params.kind == ScoreKind::additive) {
          projected_q = multiply(w1, hidden, dim_q, q_row);
        }
        for (Index j = 0; j < len_k; ++j) {
          core::load_row(k, b, h / group, j, k_row.data());
          double s = 0.0;
          switch (params.kind) {
            case ScoreKind::dot:
            case ScoreKind::scaled_dot:
              for (Index d = 0; d < dim_q; ++d) s += q_row[d] * k_row[d];
              s *= scale;
              break;
            case ScoreKind::general:
              for (Index d = 0; d < dim_k; ++d) s += projected_q[d] * k_row[d];
              break;
            case ScoreKind::additive: {
              const std::vector<double> projected_k = multiply(w2, hidden, dim_k, k_row);
              for (Index a = 0; a < hidden; ++a)
                s += energy[a] * std::tanh(projected_q[a] + projected_k[a]);
              break;
            }
          }
          s_row[j] = s;
        }
        core::store_row(out.mutable_view(), b, h, i, s_row.data());
      }
    }
  }
  return out;
}

Tensor softmax(const TensorView& scores) {
  check_float("scores", scores);
  Tensor out(scores.dtype, scores.shape);
  const Index len = scores.shape[3];
  std::vector<double> row(len);
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  constexpr double kMinusInfinity = -kInfinity;
  for (Index b = 0; b < scores.shape[0]; ++b) {
    for (Index h = 0; h < scores.shape[1]; ++h) {
      for (Index i = 0; i < scores.shape[2]; ++i) {
        core::load_row(scores, b, h, i, row.data());
        double m = kMinusInfinity;  // max is subtracted only for numerical stability
        for (Index j = 0; j < len; ++j) {
          // +inf - +inf would make the row NaN; a score of +inf has no meaningful weight.
          if (std::isnan(row[j]) || row[j] == kInfinity) {
            fail("scores", "finite values or -inf",
                 std::to_string(row[j]) + " at " + format_dims({b, h, i, j}));
          }
          m = std::max(m, row[j]);
        }
        if (m == kMinusInfinity) {
          std::fill(row.begin(), row.end(), 0.0);  // fully masked row
        } else {
          double sum = 0.0;
          for (double& x : row) sum += (x = std::exp(x - m));
          for (double& x : row) x /= sum;
        }
        core::store_row(out.mutable_view(), b, h, i, row.data());
      }
    }
  }
  return out;
}

Tensor context(const TensorView& alpha, const TensorView& v, const ContextCheck& check) {
  check_float("alpha", alpha);
  check_float("v", v);
  if (v.shape[0] != alpha.shape[0] || v.shape[2] != alpha.shape[3]) {
    fail("v",
         "shape [" + std::to_string(alpha.shape[0]) + ", Hkv, " + std::to_string(alpha.shape[3]) +
             ", Dv] (batch and key count of alpha)",
         format_dims(v.shape));
  }
  check_heads("v", v.shape[1], alpha.shape[1]);
  const Index batch = alpha.shape[0], heads = alpha.shape[1], len_q = alpha.shape[2];
  const Index len_k = alpha.shape[3], dim_v = v.shape[3], group = heads / v.shape[1];
  if (check.enabled && !(check.tolerance >= 0.0)) {
    fail("tolerance", "a number >= 0", std::to_string(check.tolerance));
  }
  // Weights stored in alpha's dtype are each off by up to its unit roundoff, so a row that
  // summed to 1 before rounding sums to within that of 1 after it.
  const double allowed = check.tolerance + unit_roundoff(alpha.dtype);
  Tensor out(v.dtype, {batch, heads, len_q, dim_v});
  std::vector<double> a_row(len_k), v_row(dim_v), c_row(dim_v);
  for (Index b = 0; b < batch; ++b) {
    for (Index h = 0; h < heads; ++h) {
      for (Index i = 0; i < len_q; ++i) {
        core::load_row(alpha, b, h, i, a_row.data());
        if (check.enabled) {
          double sum = 0.0;
          for (Index j = 0; j < len_k; ++j) {
            if (!std::isfinite(a_row[j]) || a_row[j] < 0.0) {
              fail("alpha", "finite, non-negative weights",
                   std::to_string(a_row[j]) + " at " + format_dims({b, h, i, j}));
            }
            sum += a_row[j];
          }
          if (sum != 0.0 && !(std::abs(sum - 1.0) <= allowed)) {
            fail("alpha", "rows summing to 1 (or 0 for a fully masked row)",
                 "a sum of " + std::to_string(sum) + " in row " + format_dims({b, h, i, 0}));
          }
        }
        std::fill(c_row.begin(), c_row.end(), 0.0);
        for (Index j = 0; j < len_k; ++j) {
          core::load_row(v, b, h / group, j, v_row.data());
          for (Index d = 0; d < dim_v; ++d) c_row[d] += a_row[j] * v_row[d];
        }
        core::store_row(out.mutable_view(), b, h, i, c_row.data());
      }
    }
  }
  return out;
}

}  // namespace attn
