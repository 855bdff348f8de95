#include "attn/rollout.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/argument_checks.hpp"
#include "core/rows.hpp"

namespace attn {

Tensor rollout(const TensorView& weights, double residual) {
  const Dims& shape = weights.shape;
  if (shape[0] < 1 || shape[1] < 1 || shape[2] != shape[3]) {
    core::fail("weights",
               "[layers, H, L, L] with at least one layer and head (self-attention over one "
               "text)",
               format_dims(shape));
  }
  if (weights.dtype == DType::boolean) core::fail("weights", "a float dtype", "bool");
  if (!(residual >= 0.0 && residual <= 1.0)) {
    core::fail("residual", "a share in [0, 1]", std::to_string(residual));
  }
  const Index layers = shape[0], heads = shape[1], n = shape[2];
  const auto size = static_cast<std::size_t>(n * n);
  Tensor out(DType::f64, {layers, 1, n, n});
  std::vector<double> mixed_storage(size), row_storage(static_cast<std::size_t>(n));
  double *mixed = mixed_storage.data(), *row = row_storage.data();
  for (Index l = 0; l < layers; ++l) {
    // A_l: the heads' mean, the identity's share, each row normalised.
    std::fill(mixed, mixed + n * n, 0.0);
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < n; ++i) {
        core::load_row(weights, l, h, i, row);
        for (Index j = 0; j < n; ++j) mixed[i * n + j] += row[j] / static_cast<double>(heads);
      }
    for (Index i = 0; i < n; ++i) {
      double sum = 0.0;
      for (Index j = 0; j < n; ++j) {
        double& a = mixed[i * n + j];
        a = (1.0 - residual) * a + (i == j ? residual : 0.0);
        sum += a;
      }
      if (sum > 0.0)
        for (Index j = 0; j < n; ++j) mixed[i * n + j] /= sum;
    }
    double* to = out.data_as<double>() + l * n * n;
    if (l == 0) {
      std::copy(mixed, mixed + n * n, to);
      continue;
    }
    // R_l = A_l R_(l-1), row by row.
    const double* below = to - n * n;
    for (Index i = 0; i < n; ++i) {
      double* out_row = to + i * n;
      std::fill(out_row, out_row + n, 0.0);
      for (Index k = 0; k < n; ++k) {
        const double a = mixed[i * n + k];
        if (a == 0.0) continue;
        for (Index j = 0; j < n; ++j) out_row[j] += a * below[k * n + j];
      }
    }
  }
  return out;
}

}  // namespace attn
