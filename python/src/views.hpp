// Between nanobind arrays (NumPy, DLPack producers such as torch tensors) and attn's views.
// Every check happens here, before any work, and names the argument.
//
// attn/__init__.py hands NumPy bfloat16 arrays (ml_dtypes) over as uint16 views of the same
// memory, since NumPy cannot export that dtype through DLPack or the buffer protocol; a
// uint16 array is therefore read as bfloat16 bits. This module is private to the package.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn::python {

using InputArray = nanobind::ndarray<nanobind::ro>;
using OutputArray = nanobind::ndarray<>;
using NumpyArray = nanobind::ndarray<nanobind::numpy>;

// array: [B, H, S, D] on the CPU, last dim contiguous -> a view of the same memory.
// Throws nanobind::type_error for an unsupported dtype, attn::Error for a bad layout.
TensorView input_view(const InputArray& array, const char* name, bool allow_bool = false);
MutableTensorView output_view(const OutputArray& array, const char* name);

// tensor: [B, H, S, D] -> a NumPy array that owns the tensor's storage (no copy);
// bfloat16 comes back as uint16 bits.
// The NumPy dtype of a DType: bf16 as its uint16 bits (NumPy has none; the Python layer
// views it as ml_dtypes' bfloat16 where it wants one).
nanobind::dlpack::dtype numpy_dtype(DType dtype);
NumpyArray to_numpy(Tensor&& tensor);

}  // namespace attn::python
