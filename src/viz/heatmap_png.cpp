// The PNG heatmap: the SVG's layout rasterised into an RGB buffer.
#include <string>
#include <vector>

#include "viz/colormap.hpp"
#include "viz/heatmap.hpp"
#include "viz/heatmap_layout.hpp"
#include "viz/raster.hpp"

namespace attn::viz {
namespace {

constexpr Rgb kBackground{255, 255, 255};
constexpr Rgb kInk{34, 34, 34};
constexpr Rgb kFrame{85, 85, 85};

void draw_cells(Raster& image, const HeatmapLayout& layout) {
  const Matrix& cells = layout.blocks.cells;
  for (Index r = 0; r < cells.rows; ++r) {
    for (Index c = 0; c < cells.cols; ++c) {
      image.fill({layout.plot.x + static_cast<int>(c) * layout.cell_width,
                  layout.plot.y + static_cast<int>(r) * layout.cell_height, layout.cell_width,
                  layout.cell_height},
                 colour_at(colour_position(layout, cells(r, c))));
    }
  }
}

void draw_labels(Raster& image, const HeatmapLayout& layout) {
  const Box& plot = layout.plot;
  for (const AxisLabel& label : layout.row_labels) {
    image.text_right(plot.x - 6, plot.y + label.offset, label.text, layout.font_px, kInk);
  }
  for (const AxisLabel& label : layout.column_labels) {
    image.text_up(plot.x + label.offset, plot.y - 6, label.text, layout.font_px, kInk);
  }
  image.text_centred(plot.x + plot.width / 2, layout.key_title_y - layout.font_px / 2, "key",
                     layout.font_px, kInk);
  image.text_up(layout.query_title_x - layout.font_px / 2,
                plot.y + plot.height / 2 + Raster::text_width("query", layout.font_px) / 2, "query",
                layout.font_px, kInk);
  if (!layout.title.empty()) {
    image.text_left(12, layout.title_y - layout.title_font_px / 2, layout.title,
                    layout.title_font_px, kInk);
  }
}

void draw_colour_bar(Raster& image, const HeatmapLayout& layout) {
  const Box& bar = layout.bar;
  for (int y = 0; y < bar.height; ++y) {
    const double t = 1.0 - static_cast<double>(y) / (bar.height - 1);
    image.fill({bar.x, bar.y + y, bar.width, 1}, colour_at(t));
  }
  image.frame(bar, kFrame);
  for (const double tick : layout.ticks) {
    const int y = bar_y(layout, tick);
    image.fill({bar.x + bar.width, y, 4, 1}, kInk);
    image.text_left(bar.x + bar.width + 7, y, tick_text(tick), layout.font_px, kInk);
  }
}

}  // namespace

// weights: [Lq, Lk]
std::string heatmap_png(const Matrix& weights, const HeatmapOptions& options) {
  const HeatmapLayout layout = lay_out_heatmap(weights, options);
  Raster image(layout.width, layout.height, kBackground);
  draw_cells(image, layout);
  draw_labels(image, layout);
  draw_colour_bar(image, layout);
  return image.png();
}

}  // namespace attn::viz
