// Where everything of a blend picture goes, in pixels, decided once so that the SVG and the
// PNG draw the same picture: row labels, then each row's value cells, its weight bar and its
// scaled cells; under the scaled cells a rule and C; a colour bar at the bottom.
#pragma once

#include <string>
#include <vector>

#include "viz/blend.hpp"
#include "viz/heatmap_layout.hpp"

namespace attn::viz {

struct BlendLayout {
  int cell_width = 1, cell_height = 1;
  bool numbers = false;  // each cell's value printed in it (short vectors only)
  double scale = 1.0;    // the largest |number| in any cell: the ends of the colour map
  int font_px = 12, cell_font_px = 10, title_font_px = 15;
  int width = 0, height = 0;
  int title_y = 0;         // baseline of the title
  int header_y = 0;        // centre line of the column titles
  int label_right = 0;     // right edge of the row labels
  int value_x = 0;         // left edge of the value cells
  int times_x = 0;         // centre of the "x" between the values and the bars
  int bar_x = 0;           // left edge of the weight bars
  int bar_length = 0;      // px of a bar of weight 1
  int equals_x = 0;        // centre of the "=" between the bars and the scaled cells
  int scaled_x = 0;        // left edge of the scaled cells and of C
  int rows_width = 0;      // px of a row of Dv cells
  std::vector<int> row_y;  // top edge of each row
  int rule_y = 0;          // the line that sums the scaled rows
  int context_y = 0;       // top edge of C
  Box colour_bar;          // horizontal, -scale on the left, +scale on the right
  std::vector<double> ticks;
  std::string title;
};

BlendLayout lay_out_blend(const Blend& blend);

// A number -> its position on the diverging colour map: 0 at -scale, 0.5 at 0, 1 at +scale.
double blend_colour_position(const BlendLayout& layout, double value);

// The text of a cell's number when printed in the cell.
std::string cell_text(double value);

}  // namespace attn::viz
