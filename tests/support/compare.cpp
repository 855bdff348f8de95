#include "compare.hpp"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/rows.hpp"

namespace attn::testing {

Comparison compare(const TensorView& got, const TensorView& want) {
  Comparison result;
  if (got.shape != want.shape) {
    result.hard_failure = "shape " + format_dims(got.shape) + " vs " + format_dims(want.shape);
    return result;
  }
  std::vector<double> g(static_cast<std::size_t>(got.shape[3])), w(g.size());
  double error = 0.0, energy = 0.0;
  for (Index b = 0; b < got.shape[0]; ++b)
    for (Index h = 0; h < got.shape[1]; ++h)
      for (Index s = 0; s < got.shape[2]; ++s) {
        core::load_row(got, b, h, s, g.data());
        core::load_row(want, b, h, s, w.data());
        for (std::size_t d = 0; d < g.size(); ++d) {
          const std::string where = format_dims({b, h, s, static_cast<Index>(d)});
          if (std::isnan(g[d]) != std::isnan(w[d])) {
            result.hard_failure = "NaN mismatch at " + where;
            return result;
          }
          if (std::isinf(g[d]) || std::isinf(w[d])) {
            if (g[d] != w[d]) {
              result.hard_failure = "infinity mismatch at " + where;
              return result;
            }
            continue;
          }
          if (std::isnan(g[d])) continue;
          const double diff = g[d] - w[d];
          error += diff * diff;
          energy += w[d] * w[d];
          result.max_abs = std::max(result.max_abs, std::abs(diff));
        }
      }
  result.nmse = energy > 0.0 ? error / energy : error;
  return result;
}

std::string describe(const Comparison& c) {
  std::ostringstream out;
  if (!c.hard_failure.empty()) out << "hard failure: " << c.hard_failure << "; ";
  out << "nmse " << c.nmse << ", max abs " << c.max_abs;
  return out.str();
}

GuardedTensor::GuardedTensor(DType dtype, const Dims& shape)
    : dtype_(dtype),
      shape_(shape),
      bytes_(2 * kGuardBytes + static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]) *
                                   dtype_size(dtype),
             kGuardByte) {}

MutableTensorView GuardedTensor::view() {
  return MutableTensorView(bytes_.data() + kGuardBytes, dtype_, shape_);
}

TensorView GuardedTensor::const_view() const {
  return TensorView(bytes_.data() + kGuardBytes, dtype_, shape_);
}

bool GuardedTensor::guards_intact() const {
  const std::size_t tail = bytes_.size() - kGuardBytes;
  for (std::size_t i = 0; i < kGuardBytes; ++i) {
    if (bytes_[i] != kGuardByte || bytes_[tail + i] != kGuardByte) return false;
  }
  return true;
}

}  // namespace attn::testing
