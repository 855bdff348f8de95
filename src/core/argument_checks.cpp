#include "core/argument_checks.hpp"

#include <cmath>

#include "core/position_bias.hpp"

namespace attn::core {

void fail(const std::string& argument, const std::string& expected, const std::string& given) {
  throw Error(argument + ": expected " + expected + ", given " + given);
}

void check_float_dtype(const char* name, DType dtype) {
  if (dtype == DType::boolean) fail(name, "a floating-point dtype", dtype_name(dtype));
}

void check_storage(const char* name, const TensorView& t) {
  if (t.shape[3] > 1 && t.strides[3] != 1) {
    fail(name, "a contiguous last dim (stride 1)", "stride " + std::to_string(t.strides[3]));
  }
  if (t.numel() > 0 && t.data == nullptr) fail(name, "data", "a null pointer");
}

void check_output(const char* name, const MutableTensorView& t, const Dims& shape) {
  check_float_dtype(name, t.dtype);
  if (t.shape != shape) fail(name, "shape " + format_dims(shape), format_dims(t.shape));
  check_storage(name, t);
}

void check_per_head(const char* name, const std::vector<float>& values, Index heads,
                    bool allow_minus_infinity) {
  if (values.empty()) return;
  if (static_cast<Index>(values.size()) != heads) {
    fail(name, std::to_string(heads) + " values (one per query head)",
         std::to_string(values.size()));
  }
  for (std::size_t h = 0; h < values.size(); ++h) {
    const float x = values[h];
    const bool ok = std::isfinite(x) || (allow_minus_infinity && x == -INFINITY);
    if (!ok) {
      fail(name, allow_minus_infinity ? "finite values or -inf" : "finite values",
           std::to_string(x) + " at head " + std::to_string(h));
    }
  }
}

void check_sinks(const std::vector<float>& sinks, Index heads_q) {
  check_per_head("sinks", sinks, heads_q, true);
}

double resolved_scale(const Options& options, Index dim) {
  return options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(dim));
}

void check_options(const Options& options, Index heads_q) {
  if (options.scale && !std::isfinite(*options.scale)) {
    fail("scale", "a finite number", std::to_string(*options.scale));
  }
  // With fewer than 2^30 rows (cpu::unsupported), positions and |query - key| distances
  // then fit the fast kernels' 32-bit lanes.
  constexpr Index kMaxOffset = Index{1} << 30;
  if (options.position_offset <= -kMaxOffset || options.position_offset >= kMaxOffset) {
    fail("position_offset", "a magnitude below 2^30", std::to_string(options.position_offset));
  }
  if (options.window.left < -1) {
    fail("window.left", "-1 (unbounded) or a count >= 0", std::to_string(options.window.left));
  }
  if (options.window.right < -1) {
    fail("window.right", "-1 (unbounded) or a count >= 0", std::to_string(options.window.right));
  }
  if (!(std::isfinite(options.softcap) && options.softcap >= 0.0)) {
    fail("softcap", "a finite number >= 0 (0 is off)", std::to_string(options.softcap));
  }
  if (!(options.dropout_p >= 0.0 && options.dropout_p <= 1.0)) {
    fail("dropout_p", "a probability in [0, 1] (0 is off)", std::to_string(options.dropout_p));
  }
  check_per_head("alibi_slopes", options.alibi_slopes, heads_q, false);
  check_sinks(options.sinks, heads_q);
  check_position_bias(options.position_bias, heads_q);
  if (options.threads < 0) {
    fail("threads", "0 (automatic) or a positive count", std::to_string(options.threads));
  }
}

}  // namespace attn::core
