#include "rows.hpp"

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

template <class T>
T narrow(double value) {
  if constexpr (std::is_same_v<T, float16>) {
    return to_float16(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return to_bfloat16(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

template <class Fn>
void with_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f16: fn(float16{}); return;
    case DType::bf16: fn(bfloat16{}); return;
    case DType::f32: fn(float{}); return;
    case DType::f64: fn(double{}); return;
    case DType::boolean: fn(bool{}); return;
  }
}

}  // namespace

void load_row(const TensorView& t, Index b, Index h, Index s, double* out) {
  with_type(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* row = View<const T>{static_cast<const T*>(t.data), t.shape, t.strides}.row(b, h, s);
    for (Index d = 0; d < t.shape[3]; ++d) out[d] = widen(row[d]);
  });
}

void store_row(const MutableTensorView& t, Index b, Index h, Index s, const double* in) {
  with_type(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* row = View<T>{static_cast<T*>(t.data), t.shape, t.strides}.row(b, h, s);
    for (Index d = 0; d < t.shape[3]; ++d) row[d] = narrow<T>(in[d]);
  });
}

double load_element(const TensorView& t, Index b, Index h, Index s, Index d) {
  double value = 0.0;
  with_type(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    value = widen(View<const T>{static_cast<const T*>(t.data), t.shape, t.strides}(b, h, s, d));
  });
  return value;
}

}  // namespace attn::core
