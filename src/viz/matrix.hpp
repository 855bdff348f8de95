// One head's weights as a plain row-major matrix of doubles: what every picture draws.
#pragma once

#include <vector>

#include "attn/tensor.hpp"

namespace attn::viz {

struct Matrix {
  Index rows = 0, cols = 0;
  std::vector<double> values;  // [rows, cols] row-major

  double operator()(Index row, Index col) const {
    return values[static_cast<std::size_t>(row * cols + col)];
  }
};

// weights: [B, H, Lq, Lk] of any float dtype -> its [Lq, Lk] matrix at (batch, head).
// Throws attn::Error naming `batch` or `head` when out of range, and `weights` when empty,
// boolean or holding a NaN or an infinity.
Matrix head_matrix(const TensorView& weights, Index batch, Index head);

// The smallest and largest value of `m`.
struct Range {
  double low = 0.0, high = 0.0;
};
Range value_range(const Matrix& m);

}  // namespace attn::viz
