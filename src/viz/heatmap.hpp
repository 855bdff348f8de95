// A heatmap of one head's weights: query rows down, keys across, one coloured cell per
// weight (or per block of weights for large matrices), token labels on both axes and a
// colour bar. SVG always; PNG through libpng.
#pragma once

#include <string>
#include <vector>

#include "viz/downsample.hpp"
#include "viz/matrix.hpp"

namespace attn::viz {

struct HeatmapOptions {
  std::vector<std::string> row_labels;     // empty, or one token per query row
  std::vector<std::string> column_labels;  // empty, or one token per key
  std::string title;
  Reduce reduce = Reduce::max;  // how a block of weights becomes one cell
  Index max_cells = 512;        // cells per side at most; larger matrices are downsampled
};

// weights: [Lq, Lk]. Throws attn::Error naming row_labels or column_labels when their
// count does not match, and max_cells when it is below 1.
std::string heatmap_svg(const Matrix& weights, const HeatmapOptions& options);

// weights: [Lq, Lk] -> the bytes of an 8-bit RGB PNG file; same picture as the SVG.
std::string heatmap_png(const Matrix& weights, const HeatmapOptions& options);

}  // namespace attn::viz
