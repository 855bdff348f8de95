#include "attn/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <string>

namespace attn {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::boolean:
      return "bool";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::boolean:
      return 1;
  }
  return 0;
}

std::string format_dims(const Dims& dims) {
  std::ostringstream out;
  out << '[' << dims[0] << ", " << dims[1] << ", " << dims[2] << ", " << dims[3] << ']';
  return out.str();
}

Dims contiguous_strides(const Dims& shape) {
  return {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
}

Dims bshd_strides(const Dims& bhsd_shape) {
  const Index heads = bhsd_shape[1], seq = bhsd_shape[2], dim = bhsd_shape[3];
  return {seq * heads * dim, dim, heads * dim, 1};
}

namespace {

// The byte offset of row `first` of the seq dim, after checking [first, first + count).
std::ptrdiff_t row_offset(DType dtype, const Dims& shape, const Dims& strides, Index first,
                          Index count) {
  if (first < 0 || count < 0 || first + count > shape[2]) {
    throw Error("rows: expected 0 <= first <= first + count <= " + std::to_string(shape[2]) +
                " (the seq length), given first " + std::to_string(first) + ", count " +
                std::to_string(count));
  }
  return static_cast<std::ptrdiff_t>(first * strides[2]) *
         static_cast<std::ptrdiff_t>(dtype_size(dtype));
}

}  // namespace

TensorView TensorView::rows(Index first, Index count) const {
  const std::ptrdiff_t offset = row_offset(dtype, shape, strides, first, count);
  Dims sliced = shape;
  sliced[2] = count;
  return TensorView(data == nullptr ? nullptr : static_cast<const char*>(data) + offset, dtype,
                    sliced, strides);
}

MutableTensorView MutableTensorView::rows(Index first, Index count) const {
  const std::ptrdiff_t offset = row_offset(dtype, shape, strides, first, count);
  Dims sliced = shape;
  sliced[2] = count;
  return MutableTensorView(data == nullptr ? nullptr : static_cast<char*>(data) + offset, dtype,
                           sliced, strides);
}

namespace detail {
void throw_dtype_mismatch(const char* argument, DType wanted, DType given) {
  throw Error(std::string(argument) + ": expected dtype " + dtype_name(wanted) + ", given " +
              dtype_name(given));
}
}  // namespace detail

void Tensor::Free::operator()(void* p) const {
  std::free(p);
}

Tensor::Tensor(DType dtype, const Dims& shape) : dtype_(dtype), shape_(shape) {
  // The byte count is computed with overflow checks: an absurd shape (say, from a file
  // header) must be an error, not a wrapped-around small allocation.
  auto bytes = static_cast<Index>(dtype_size(dtype));
  for (const Index extent : shape) {
    if (extent < 0) {
      throw Error("Tensor shape: expected non-negative extents, given " + format_dims(shape));
    }
    if (__builtin_mul_overflow(bytes, extent, &bytes)) {
      throw Error("Tensor shape: expected fewer than 2^63 bytes in all, given " +
                  format_dims(shape) + " of " + dtype_name(dtype));
    }
  }
  constexpr std::size_t kAlignment = 64;
  // aligned_alloc wants a multiple of the alignment, and at least one byte so that an empty
  // tensor still owns storage (empty() means "not asked for", not "zero elements").
  const std::size_t padded =
      (static_cast<std::size_t>(bytes) + kAlignment) / kAlignment * kAlignment;
  void* memory = std::aligned_alloc(kAlignment, padded);
  if (memory == nullptr) throw std::bad_alloc();
  std::memset(memory, 0, padded);
  storage_.reset(memory);
}

void Tensor::check_dtype(DType wanted) const {
  if (wanted != dtype_) detail::throw_dtype_mismatch("Tensor::data_as", wanted, dtype_);
}

}  // namespace attn
