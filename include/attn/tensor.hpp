// Views and tensors over [batch, heads, seq, dim]. The last dim is contiguous; the other
// strides are free, so both BHSD and BSHD layouts are views without a copy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "attn/error.hpp"
#include "attn/half.hpp"

namespace attn {

using Index = std::int64_t;
using Dims = std::array<Index, 4>;  // [batch, heads, seq, dim]

enum class DType : std::uint8_t { f16, bf16, f32, f64, boolean };

const char* dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<bfloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::boolean;
}

// "[2, 8, 128, 64]"
std::string format_dims(const Dims& dims);
// Row-major strides of a contiguous [b, h, s, d] array.
Dims contiguous_strides(const Dims& shape);
// Strides of a contiguous [b, s, h, d] array seen as [b, h, s, d].
Dims bshd_strides(const Dims& bhsd_shape);

// A typed strided view; strides count elements.
template <class T>
struct View {
  T* data = nullptr;
  Dims shape{};
  Dims strides{};

  T* row(Index b, Index h, Index s) const {
    return data + b * strides[0] + h * strides[1] + s * strides[2];
  }
  T& operator()(Index b, Index h, Index s, Index d) const { return row(b, h, s)[d * strides[3]]; }
};

// A view whose element type is known at run time.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::f32;
  Dims shape{};
  Dims strides{};

  TensorView() = default;
  TensorView(const void* data_, DType dtype_, const Dims& shape_, const Dims& strides_)
      : data(data_), dtype(dtype_), shape(shape_), strides(strides_) {}
  TensorView(const void* data_, DType dtype_, const Dims& shape_)
      : TensorView(data_, dtype_, shape_, contiguous_strides(shape_)) {}

  Index numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  // Rows [first, first + count) of the seq dim, as a view of the same storage (a shard of
  // a sequence, a chunk of a prompt); attn::Error unless 0 <= first <= first + count <=
  // shape[2].
  TensorView rows(Index first, Index count) const;

  // Throws attn::Error naming `argument` unless dtype is T.
  template <class T>
  View<const T> as(const char* argument) const;
};

struct MutableTensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Dims shape{};
  Dims strides{};

  MutableTensorView() = default;
  MutableTensorView(void* data_, DType dtype_, const Dims& shape_, const Dims& strides_)
      : data(data_), dtype(dtype_), shape(shape_), strides(strides_) {}
  MutableTensorView(void* data_, DType dtype_, const Dims& shape_)
      : MutableTensorView(data_, dtype_, shape_, contiguous_strides(shape_)) {}

  operator TensorView() const { return TensorView(data, dtype, shape, strides); }
  Index numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  MutableTensorView rows(Index first, Index count) const;

  template <class T>
  View<T> as(const char* argument) const;
};

// An owning, contiguous [b, h, s, d] array, 64-byte aligned and zero-initialised.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, const Dims& shape);

  DType dtype() const { return dtype_; }
  const Dims& shape() const { return shape_; }
  Index numel() const { return shape_[0] * shape_[1] * shape_[2] * shape_[3]; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return storage_ == nullptr; }

  void* data() { return storage_.get(); }
  const void* data() const { return storage_.get(); }
  template <class T>
  T* data_as() {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(data());
  }
  template <class T>
  const T* data_as() const {
    check_dtype(dtype_of<T>());
    return static_cast<const T*>(data());
  }

  TensorView view() const { return TensorView(data(), dtype_, shape_); }
  MutableTensorView mutable_view() { return MutableTensorView(data(), dtype_, shape_); }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  void check_dtype(DType wanted) const;

  DType dtype_ = DType::f32;
  Dims shape_{};
  std::unique_ptr<void, Free> storage_;
};

namespace detail {
[[noreturn]] void throw_dtype_mismatch(const char* argument, DType wanted, DType given);
}

template <class T>
View<const T> TensorView::as(const char* argument) const {
  if (dtype != dtype_of<T>()) detail::throw_dtype_mismatch(argument, dtype_of<T>(), dtype);
  return View<const T>{static_cast<const T*>(data), shape, strides};
}

template <class T>
View<T> MutableTensorView::as(const char* argument) const {
  if (dtype != dtype_of<T>()) detail::throw_dtype_mismatch(argument, dtype_of<T>(), dtype);
  return View<T>{static_cast<T*>(data), shape, strides};
}

}  // namespace attn
