#include "viz/downsample.hpp"

#include <algorithm>
#include <string>

namespace attn::viz {

Reduce parse_reduce(const std::string& name, const char* argument) {
  if (name == "max") return Reduce::max;
  if (name == "mean") return Reduce::mean;
  throw Error(std::string(argument) + ": expected 'max' or 'mean', given '" + name + "'");
}

// m: [rows, cols] -> [ceil(rows / rb), ceil(cols / cb)]
Blocks downsample(const Matrix& m, Index max_cells, Reduce reduce) {
  if (max_cells < 1) {
    throw Error("max_cells: expected at least 1, given " + std::to_string(max_cells));
  }
  Blocks blocks;
  blocks.row_block = (m.rows + max_cells - 1) / max_cells;
  blocks.col_block = (m.cols + max_cells - 1) / max_cells;
  Matrix& cells = blocks.cells;
  cells.rows = (m.rows + blocks.row_block - 1) / blocks.row_block;
  cells.cols = (m.cols + blocks.col_block - 1) / blocks.col_block;
  cells.values.assign(static_cast<std::size_t>(cells.rows * cells.cols), 0.0);
  for (Index r = 0; r < cells.rows; ++r) {
    const Index row_end = std::min(m.rows, (r + 1) * blocks.row_block);
    for (Index c = 0; c < cells.cols; ++c) {
      const Index col_end = std::min(m.cols, (c + 1) * blocks.col_block);
      double max = m(r * blocks.row_block, c * blocks.col_block), sum = 0.0;
      for (Index i = r * blocks.row_block; i < row_end; ++i) {
        for (Index j = c * blocks.col_block; j < col_end; ++j) {
          max = std::max(max, m(i, j));
          sum += m(i, j);
        }
      }
      const auto count =
          static_cast<double>((row_end - r * blocks.row_block) * (col_end - c * blocks.col_block));
      cells.values[static_cast<std::size_t>(r * cells.cols + c)] =
          reduce == Reduce::max ? max : sum / count;
    }
  }
  return blocks;
}

}  // namespace attn::viz
