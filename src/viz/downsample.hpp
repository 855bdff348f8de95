// Large matrices drawn at a readable size: blocks of neighbouring weights become one cell,
// holding their largest value (so a sharp peak stays visible) or their mean (so the cell
// shows how much weight the block holds on average).
#pragma once

#include <string>

#include "viz/matrix.hpp"

namespace attn::viz {

enum class Reduce : unsigned char { max, mean };

// "max" or "mean"; throws attn::Error naming `argument` otherwise.
Reduce parse_reduce(const std::string& name, const char* argument);

struct Blocks {
  Matrix cells;         // [ceil(rows / row_block), ceil(cols / col_block)]
  Index row_block = 1;  // rows of the input per cell; the last cell may hold fewer
  Index col_block = 1;
};

// m: [rows, cols] -> at most max_cells cells per side; blocks of 1 x 1 when m fits.
// Throws attn::Error naming max_cells unless it is at least 1.
Blocks downsample(const Matrix& m, Index max_cells, Reduce reduce);

}  // namespace attn::viz
