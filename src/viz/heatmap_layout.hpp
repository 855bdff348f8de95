// Where everything of a heatmap goes, in pixels, decided once so that the SVG and the PNG
// draw the same picture. Cells are sized so that 8 tokens and 512 tokens both fit a screen
// (square for square matrices; a single decode row stays a visible strip); labels shrink to a
// smallest readable size and then only every n-th token is labelled.
#pragma once

#include <string>
#include <vector>

#include "viz/downsample.hpp"
#include "viz/heatmap.hpp"

namespace attn::viz {

struct AxisLabel {
  int offset = 0;  // centre of the labelled row or column, in px from the plot's edge
  std::string text;
};

struct Box {
  int x = 0, y = 0, width = 0, height = 0;
};

struct HeatmapLayout {
  Blocks blocks;        // the cells drawn
  Range range;          // values mapped to the two ends of the colour map
  int cell_width = 1;   // px per cell across
  int cell_height = 1;  // px per cell down
  int width = 0, height = 0;
  Box plot;          // the cells: blocks.cells.cols * cell wide
  Box bar;           // the colour bar, high values at the top
  int font_px = 12;  // labels and ticks
  int title_font_px = 15;
  int title_y = 0;        // baseline of the title
  int key_title_y = 0;    // baseline of "key" above the column labels
  int query_title_x = 0;  // baseline of "query", turned, left of the row labels
  std::vector<AxisLabel> row_labels, column_labels;
  std::vector<double> ticks;  // values marked on the colour bar, inside range
  std::string title;
};

// weights: [Lq, Lk]
HeatmapLayout lay_out_heatmap(const Matrix& weights, const HeatmapOptions& options);

// value -> position on the colour map, 0 at range.low and 1 at range.high.
double colour_position(const HeatmapLayout& layout, double value);

// y in px of `value` on the colour bar.
int bar_y(const HeatmapLayout& layout, double value);

// The width in px that `text` takes at `font_px` in the SVG's sans-serif font, generously.
int text_width(const std::string& text, int font_px);

// A tick value as printed: at most 3 significant digits, no trailing zeros.
std::string tick_text(double value);

}  // namespace attn::viz
