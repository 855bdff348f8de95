#include "rows.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/element_type.hpp"

namespace attn::core {
namespace {

template <class T>
double widen(T value) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return static_cast<double>(to_float(value));
  } else {
    return static_cast<double>(value);
  }
}

// value rounded to a float by round-to-odd: of the two floats around an inexact value, the
// one whose last bit is 1. Rounding that float to a 16-bit format then gives the same result
// as rounding value directly (float's 24 bits are at least 2p + 2 for p = 11 or 8), where
// double -> float -> half by round-to-nearest twice can be off by one unit on a near-tie.
float round_to_odd(double value) {
  const float nearest = static_cast<float>(value);
  if (static_cast<double>(nearest) == value || std::isnan(value)) return nearest;
  const float other =
      std::nextafter(nearest, static_cast<float>(value > nearest ? INFINITY : -INFINITY));
  return (std::bit_cast<std::uint32_t>(nearest) & 1u) ? nearest : other;
}

template <class T>
T narrow(double value) {
  if constexpr (std::is_same_v<T, float16>) {
    return to_float16(round_to_odd(value));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return to_bfloat16(round_to_odd(value));
  } else {
    return static_cast<T>(value);
  }
}

}  // namespace

void load_row(const TensorView& t, Index b, Index h, Index s, double* out) {
  with_element_type(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* row = View<const T>{static_cast<const T*>(t.data), t.shape, t.strides}.row(b, h, s);
    for (Index d = 0; d < t.shape[3]; ++d) out[d] = widen(row[d]);
  });
}

void store_row(const MutableTensorView& t, Index b, Index h, Index s, const double* in) {
  with_element_type(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* row = View<T>{static_cast<T*>(t.data), t.shape, t.strides}.row(b, h, s);
    for (Index d = 0; d < t.shape[3]; ++d) row[d] = narrow<T>(in[d]);
  });
}

double load_element(const TensorView& t, Index b, Index h, Index s, Index d) {
  double value = 0.0;
  with_element_type(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    value = widen(View<const T>{static_cast<const T*>(t.data), t.shape, t.strides}(b, h, s, d));
  });
  return value;
}

}  // namespace attn::core
