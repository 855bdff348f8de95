#include "views.hpp"

#include <cstdint>
#include <string>
#include <utility>

namespace nb = nanobind;

namespace attn::python {
namespace {

[[noreturn]] void fail(const char* name, const std::string& expected, const std::string& given) {
  throw Error(std::string(name) + ": expected " + expected + ", given " + given);
}

// "float16", "int64", "bool": the given dtype, for error messages.
std::string dlpack_dtype_text(nb::dlpack::dtype dtype) {
  std::string kind;
  switch (static_cast<nb::dlpack::dtype_code>(dtype.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      kind = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      return "DLPack dtype code " + std::to_string(dtype.code);
  }
  return kind + std::to_string(dtype.bits);
}

DType to_dtype(nb::dlpack::dtype dtype, const char* name, bool allow_bool) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(dtype.code);
  if (dtype.lanes == 1) {
    if (code == Code::Float && dtype.bits == 16) return DType::f16;
    if (code == Code::Float && dtype.bits == 32) return DType::f32;
    if (code == Code::Float && dtype.bits == 64) return DType::f64;
    if (code == Code::Bfloat && dtype.bits == 16) return DType::bf16;
    if (code == Code::UInt && dtype.bits == 16) return DType::bf16;  // see views.hpp
    if (allow_bool && code == Code::Bool && dtype.bits == 8) return DType::boolean;
  }
  const char* expected = allow_bool ? "dtype bool, float16, bfloat16, float32 or float64"
                                    : "dtype float16, bfloat16, float32 or float64";
  throw nb::type_error(
      (std::string(name) + ": expected " + expected + ", given " + dlpack_dtype_text(dtype))
          .c_str());
}

// The checks shared by inputs and outputs; returns the [B, H, S, D] shape and strides.
template <class Array>
std::pair<Dims, Dims> checked_layout(const Array& array, const char* name, DType dtype) {
  if (array.device_type() != nb::device::cpu::value) {
    fail(name, "an array in CPU memory",
         "an array on DLPack device type " + std::to_string(array.device_type()));
  }
  if (array.ndim() != 4) fail(name, "4 dims", std::to_string(array.ndim()) + " dims");
  Dims shape{}, strides{};
  for (std::size_t axis = 0; axis < 4; ++axis) {
    shape[axis] = static_cast<Index>(array.shape(axis));
    strides[axis] = array.stride(axis);
  }
  // An empty array has no element to misread; NumPy may report its strides as all zero.
  if (shape[0] * shape[1] * shape[2] * shape[3] == 0) return {shape, contiguous_strides(shape)};
  for (std::size_t axis = 0; axis < 4; ++axis) {
    if (strides[axis] < 0) {
      fail(name, "non-negative strides",
           "stride " + std::to_string(strides[axis]) + " on axis " + std::to_string(axis));
    }
  }
  if (shape[3] > 1 && strides[3] != 1) {
    fail(name, "a contiguous last dim (stride 1)", "stride " + std::to_string(strides[3]));
  }
  const auto address = reinterpret_cast<std::uintptr_t>(array.data());
  if (address % dtype_size(dtype) != 0) {
    fail(name, "data aligned to " + std::to_string(dtype_size(dtype)) + " bytes",
         "address " + std::to_string(address));
  }
  return {shape, strides};
}

}  // namespace

TensorView input_view(const InputArray& array, const char* name, bool allow_bool) {
  const DType dtype = to_dtype(array.dtype(), name, allow_bool);
  const auto [shape, strides] = checked_layout(array, name, dtype);
  return TensorView(array.data(), dtype, shape, strides);
}

MutableTensorView output_view(const OutputArray& array, const char* name) {
  const DType dtype = to_dtype(array.dtype(), name, false);
  const auto [shape, strides] = checked_layout(array, name, dtype);
  return MutableTensorView(array.data(), dtype, shape, strides);
}

nb::dlpack::dtype numpy_dtype(DType type) {
  nb::dlpack::dtype dtype{};
  switch (type) {
    case DType::f16:
      dtype = nb::dtype<float>(), dtype.bits = 16;
      break;
    case DType::bf16:
      dtype = nb::dtype<std::uint16_t>();
      break;
    case DType::f32:
      dtype = nb::dtype<float>();
      break;
    case DType::f64:
      dtype = nb::dtype<double>();
      break;
    case DType::boolean:
      dtype = nb::dtype<bool>();
      break;
  }
  return dtype;
}

NumpyArray to_numpy(Tensor&& tensor) {
  const Dims dims = tensor.shape();
  const std::size_t shape[4] = {
      static_cast<std::size_t>(dims[0]), static_cast<std::size_t>(dims[1]),
      static_cast<std::size_t>(dims[2]), static_cast<std::size_t>(dims[3])};
  const nb::dlpack::dtype dtype = numpy_dtype(tensor.dtype());
  auto* owned = new Tensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return NumpyArray(owned->data(), 4, shape, owner, nullptr, dtype);
}

}  // namespace attn::python
