// A self-contained HTML page of one layer's weights: every head as a small heatmap, one
// head large, and a "head view" (as BertViz draws it): tokens in two columns, and hovering
// a query token draws lines to the keys it attends to, thicker for larger weights. Data,
// style and script are all inline, so the page opens without network access.
#pragma once

#include <string>
#include <vector>

#include "attn/tensor.hpp"
#include "viz/downsample.hpp"

namespace attn::viz {

struct PageOptions {
  std::vector<std::string> row_labels;     // empty, or one token per query row
  std::vector<std::string> column_labels;  // empty, or one token per key
  std::string title;
  Reduce reduce = Reduce::max;  // how a block of weights becomes one cell
  // Cells per side at most, per head. Every head is in the page's data; 128 x 128 cells
  // keep 16 heads near 2 MB.
  Index max_cells = 128;
};

// weights: [B, H, Lq, Lk] -> the page for batch entry `batch`, all H heads. Throws
// attn::Error naming batch, weights, row_labels, column_labels or max_cells.
std::string attention_page_html(const TensorView& weights, Index batch, const PageOptions& options);

}  // namespace attn::viz
