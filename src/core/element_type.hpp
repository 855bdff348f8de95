// Compile-time dispatch on a view's run-time dtype, and typed access to its rows: the one
// place that maps DType to a C++ element type, for the reference, I/O and the kernels.
#pragma once

#include <type_traits>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn::core {

// Calls fn with a value of the element type of `dtype` (bool included).
template <class Fn>
void with_element_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f16:
      fn(float16{});
      return;
    case DType::bf16:
      fn(bfloat16{});
      return;
    case DType::f32:
      fn(float{});
      return;
    case DType::f64:
      fn(double{});
      return;
    case DType::boolean:
      fn(bool{});
      return;
  }
}

// Calls fn with a value of the floating-point element type of `dtype`; does nothing for
// bool, which validation keeps away from every float input and output.
template <class Fn>
void with_float_type(DType dtype, Fn&& fn) {
  with_element_type(dtype, [&](auto tag) {
    if constexpr (!std::is_same_v<decltype(tag), bool>) fn(tag);
  });
}

// Row [b, h, s] of a view whose element type is T.
template <class T>
const T* row_of(const TensorView& t, Index b, Index h, Index s) {
  return static_cast<const T*>(t.data) + b * t.strides[0] + h * t.strides[1] + s * t.strides[2];
}

template <class T>
T* row_of(const MutableTensorView& t, Index b, Index h, Index s) {
  return static_cast<T*>(t.data) + b * t.strides[0] + h * t.strides[1] + s * t.strides[2];
}

inline Index round_up(Index value, Index multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// value rounded to T (to nearest even for the 16-bit types).
template <class T>
T from_float(float value) {
  if constexpr (std::is_same_v<T, float16>) {
    return to_float16(value);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return to_bfloat16(value);
  } else {
    return static_cast<T>(value);
  }
}

// value exactly, as a double.
template <class T>
double to_double(T value) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return to_float(value);
  } else {
    return static_cast<double>(value);
  }
}

}  // namespace attn::core
