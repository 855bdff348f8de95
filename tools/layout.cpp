#include "layout.hpp"

#include <array>

namespace attn::tools {
namespace {

// The [b, h, s, d] axes in the order a file stores them.
std::array<int, 4> file_order(Layout layout) {
  if (layout == Layout::bshd) return {0, 2, 1, 3};
  return {0, 1, 2, 3};
}

}  // namespace

Layout parse_layout(const std::string& name) {
  if (name == "bhsd") return Layout::bhsd;
  if (name == "bshd") return Layout::bshd;
  throw Error("--layout: expected bhsd or bshd, given '" + name + "'");
}

Placement place(Layout layout, const io::Shape& shape) {
  if (shape.size() > 4)
    throw Error("shape " + io::format_shape(shape) + ": expected at most 4 dims");
  const std::array<int, 4> order = file_order(layout);
  // A rank-r file holds the last r axes of [b, h, s, d]: the dropped ones are the leading.
  const int first_present = 4 - static_cast<int>(shape.size());
  Placement placement{{1, 1, 1, 1}, {}};
  std::size_t next = 0;
  for (const int axis : order) {
    if (axis >= first_present) placement.shape[axis] = shape[next++];
  }
  Index stride = 1;
  for (int i = 3; i >= 0; --i) {
    placement.strides[order[i]] = stride;
    stride *= placement.shape[order[i]];
  }
  return placement;
}

std::size_t sequence_axis(Layout layout, std::size_t rank) {
  const int first_present = 4 - static_cast<int>(rank);
  std::size_t axis = 0;
  for (const int dim : file_order(layout)) {
    if (dim == 2) break;
    if (dim >= first_present) ++axis;
  }
  return axis;
}

io::Shape file_shape(Layout layout, const Dims& bhsd, std::size_t rank) {
  int first_present = 0;
  while (first_present < 4 && 4 - static_cast<std::size_t>(first_present) > rank &&
         bhsd[first_present] == 1) {
    ++first_present;
  }
  io::Shape shape;
  for (const int axis : file_order(layout)) {
    if (axis >= first_present) shape.push_back(bhsd[axis]);
  }
  return shape;
}

}  // namespace attn::tools
