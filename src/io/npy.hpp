// NumPy .npy files (format versions 1.0, 2.0 and 3.0) in and out of attn tensors.
#pragma once

#include <string>
#include <vector>

#include "attn/tensor.hpp"
#include "io/staged_file.hpp"

namespace attn::io {

// A file's own shape: rank 0 to 4.
using Shape = std::vector<Index>;

// `shape` right-aligned into [b, h, s, d], the missing leading dims 1:
// [D] -> [1, 1, 1, D], [L, D] -> [1, 1, L, D], [H, L, D] -> [1, H, L, D].
Dims right_aligned(const Shape& shape);

// "(2, 3)", as NumPy prints a shape.
std::string format_shape(const Shape& shape);

// An array read from a .npy file: its shape as stored, and its elements in a contiguous
// Tensor of dims right_aligned(shape).
struct NpyArray {
  Shape shape;
  Tensor tensor;
};

// Reads little-endian float16, float32 or float64 ('<f2' '<f4' '<f8') or bool ('|b1')
// arrays of rank 0 to 4 in C order. Anything else, or a file that is truncated, malformed
// or larger than its header says, throws attn::Error naming `path` and what is wrong.
NpyArray read_npy(const std::string& path);

// The shape in the header of the .npy file at `path`, after every check read_npy makes
// but without reading the elements.
Shape read_npy_shape(const std::string& path);

// Rows [first, first + count) of one dim of an array.
struct RowRange {
  Index first = 0, count = 0;
};

// Only the given rows of dim `axis` of the .npy file at `path` (in the order of `ranges`),
// for a process that holds a slice of a sequence: the array read has the file's shape with
// dim `axis` the ranges' total count. The file is checked as by read_npy; a range outside
// the dim throws attn::Error naming `path`.
NpyArray read_npy_rows(const std::string& path, std::size_t axis,
                       const std::vector<RowRange>& ranges);

// A C-order array of `shape` as rows of dim `axis`: `outer` runs of shape[axis] rows of
// `row_bytes` each (the dims before `axis` multiply into outer, those after into a row).
struct RowLayout {
  Index outer = 1;
  std::size_t row_bytes = 0;
};
RowLayout row_layout(const Shape& shape, std::size_t axis, std::size_t element_bytes);

// A rank-1 float .npy file (ALiBi slopes, sinks: [H]) as float32 values.
std::vector<float> read_npy_vector(const std::string& path);

// The bytes before the elements of a .npy file (format 1.0) of `dtype` and `shape`: magic,
// version, length and the dict, padded so that the data starts on a 64-byte boundary.
// Throws attn::Error naming `path` for bfloat16 or more than 4 dims.
std::string npy_header(const std::string& path, DType dtype, const Shape& shape);

// data: a view whose dims equal right_aligned(shape), in any strides with a contiguous last
// dim. Writes its elements in C order as a .npy file of `shape` under a temporary name;
// commit() on the result moves it into place. bfloat16 has no .npy dtype and is refused.
StagedFile stage_npy(const std::string& path, const TensorView& data, const Shape& shape);

// stage_npy, then commit.
void write_npy(const std::string& path, const TensorView& data, const Shape& shape);

}  // namespace attn::io
