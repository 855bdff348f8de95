#include "viz/matrix.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/rows.hpp"

namespace attn::viz {

// weights: [B, H, Lq, Lk] -> [Lq, Lk]
Matrix head_matrix(const TensorView& weights, Index batch, Index head) {
  const Dims& shape = weights.shape;
  if (weights.dtype == DType::boolean) {
    throw Error("weights: expected float16, bfloat16, float32 or float64, given bool");
  }
  if (shape[2] < 1 || shape[3] < 1) {
    throw Error("weights: expected at least one query row and one key, given shape " +
                format_dims(shape));
  }
  if (batch < 0 || batch >= shape[0]) {
    throw Error("batch: expected 0 .. " + std::to_string(shape[0] - 1) + " (weights " +
                format_dims(shape) + "), given " + std::to_string(batch));
  }
  if (head < 0 || head >= shape[1]) {
    throw Error("head: expected 0 .. " + std::to_string(shape[1] - 1) + " (weights " +
                format_dims(shape) + "), given " + std::to_string(head));
  }
  Matrix m{shape[2], shape[3], std::vector<double>(static_cast<std::size_t>(shape[2] * shape[3]))};
  for (Index row = 0; row < m.rows; ++row) {
    double* out = m.values.data() + row * m.cols;
    core::load_row(weights, batch, head, row, out);
    const double* bad = std::find_if(out, out + m.cols, [](double x) { return !std::isfinite(x); });
    if (bad != out + m.cols) {
      throw Error("weights: expected finite values, given " + std::to_string(*bad) + " at [" +
                  std::to_string(batch) + ", " + std::to_string(head) + ", " + std::to_string(row) +
                  ", " + std::to_string(bad - out) + "]");
    }
  }
  return m;
}

Range value_range(const Matrix& m) {
  const auto [low, high] = std::minmax_element(m.values.begin(), m.values.end());
  return {*low, *high};
}

}  // namespace attn::viz
