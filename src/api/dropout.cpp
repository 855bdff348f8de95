#include "attn/dropout.hpp"

#include <string>

#include "core/argument_checks.hpp"
#include "core/dropout.hpp"

namespace attn {

Tensor dropout_mask(const Dims& shape, double dropout_p, std::uint64_t seed) {
  for (const Index d : shape) {
    if (d < 0) core::fail("shape", "four sizes >= 0 [B, Hq, Lq, Lk]", format_dims(shape));
  }
  if (!(dropout_p >= 0.0 && dropout_p <= 1.0)) {
    core::fail("dropout_p", "a probability in [0, 1]", std::to_string(dropout_p));
  }
  const core::Dropout dropout = core::make_dropout(dropout_p, seed);
  Tensor mask(DType::boolean, shape);
  const View<bool> out = mask.mutable_view().as<bool>("mask");
  for (Index b = 0; b < shape[0]; ++b)
    for (Index h = 0; h < shape[1]; ++h)
      for (Index i = 0; i < shape[2]; ++i) {
        const core::DropoutRow row = core::dropout_row(seed, b, h, i);
        bool* kept = out.row(b, h, i);
        for (Index j = 0; j < shape[3]; ++j) kept[j] = dropout.keeps(row, j);
      }
  return mask;
}

}  // namespace attn
