#include "viz/heatmap_layout.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "viz/markup.hpp"
#include "viz/tokens.hpp"

namespace attn::viz {
namespace {

// The plot aims at this many px per side; cells stay between these sizes.
constexpr int kPlotTarget = 640;
constexpr int kLargestCell = 40;
constexpr int kSmallestFont = 10;
constexpr int kLargestFont = 13;
constexpr std::size_t kLongestLabel = 14;  // code points; longer tokens end in an ellipsis
constexpr int kPad = 12;
constexpr int kTickLength = 4;
constexpr int kBarWidth = 14;
constexpr int kBarGap = 18;

// The smallest of 1, 2, 5, 10, 20, 50, ... that spaces labels at least `spacing` px apart
// when each token takes `px_per_token`.
Index label_step(double px_per_token, int spacing) {
  for (Index scale = 1;; scale *= 10) {
    for (const Index step : {scale, 2 * scale, 5 * scale}) {
      if (static_cast<double>(step) * px_per_token >= spacing) return step;
    }
  }
}

// Labels every `step` tokens: the token itself, or its index when no tokens are given.
std::vector<AxisLabel> axis_labels(Index count, const std::vector<std::string>& tokens,
                                   double px_per_token, Index step) {
  std::vector<AxisLabel> labels;
  for (Index i = 0; i < count; i += step) {
    const std::string text = tokens.empty()
                                 ? std::to_string(i)
                                 : shortened(tokens[static_cast<std::size_t>(i)], kLongestLabel);
    labels.push_back(
        {static_cast<int>(std::floor((static_cast<double>(i) + 0.5) * px_per_token)), text});
  }
  return labels;
}

int widest(const std::vector<AxisLabel>& labels, int font_px) {
  int width = 0;
  for (const AxisLabel& label : labels) width = std::max(width, text_width(label.text, font_px));
  return width;
}

// 1, 2 or 5 times a power of ten, so that `span` holds at most `count` steps.
double tick_step(double span, int count) {
  const double rough = span / count;
  const double power = std::pow(10.0, std::floor(std::log10(rough)));
  for (const double multiple : {1.0, 2.0, 5.0, 10.0}) {
    if (multiple * power >= rough) return multiple * power;
  }
  return 10.0 * power;
}

}  // namespace

// weights: [Lq, Lk]
HeatmapLayout lay_out_heatmap(const Matrix& weights, const HeatmapOptions& options) {
  check_label_count(options.row_labels, weights.rows, "row_labels", "query row");
  check_label_count(options.column_labels, weights.cols, "column_labels", "key");
  HeatmapLayout layout;
  layout.blocks = downsample(weights, options.max_cells, options.reduce);
  const Matrix& cells = layout.blocks.cells;
  // Weights are >= 0, so the scale starts at 0 and a uniform row does not look peaked.
  const Range values = value_range(cells);
  layout.range = {std::min(0.0, values.low), values.high};
  if (!(layout.range.high > layout.range.low)) layout.range.high = layout.range.low + 1.0;
  const auto cell_size = [](Index count) {
    return std::clamp(kPlotTarget / static_cast<int>(count), 1, kLargestCell);
  };
  layout.cell_width = cell_size(cells.cols);
  layout.cell_height = cell_size(cells.rows);

  const double px_per_row = static_cast<double>(layout.cell_height) / layout.blocks.row_block;
  const double px_per_col = static_cast<double>(layout.cell_width) / layout.blocks.col_block;
  layout.font_px = std::clamp(static_cast<int>(std::min(px_per_row, px_per_col)) - 2, kSmallestFont,
                              kLargestFont);
  const int spacing = layout.font_px + 3;
  layout.row_labels =
      axis_labels(weights.rows, options.row_labels, px_per_row, label_step(px_per_row, spacing));
  layout.column_labels =
      axis_labels(weights.cols, options.column_labels, px_per_col, label_step(px_per_col, spacing));

  layout.title = options.title;
  const int title_height = options.title.empty() ? 0 : layout.title_font_px + 10;
  const int axis_title = layout.font_px + 8;  // "query" down the left, "key" along the top
  layout.title_y = kPad + layout.title_font_px;
  layout.key_title_y = kPad + title_height + layout.font_px;
  layout.query_title_x = kPad + layout.font_px;
  layout.plot.x = kPad + axis_title + widest(layout.row_labels, layout.font_px) + kTickLength + 4;
  layout.plot.y = kPad + title_height + axis_title + widest(layout.column_labels, layout.font_px) +
                  kTickLength + 4;
  layout.plot.width = static_cast<int>(cells.cols) * layout.cell_width;
  layout.plot.height = static_cast<int>(cells.rows) * layout.cell_height;

  layout.bar = {layout.plot.x + layout.plot.width + kBarGap, layout.plot.y, kBarWidth,
                std::max(layout.plot.height, 120)};
  const double span = layout.range.high - layout.range.low;
  const double step = tick_step(span, 5);
  int widest_tick = 0;
  for (double tick = std::ceil(layout.range.low / step) * step;
       tick <= layout.range.high + 1e-9 * span; tick += step) {
    // Snap away the accumulated rounding (0.30000000000000004) before printing.
    const double snapped = std::round(tick / step) * step;
    layout.ticks.push_back(snapped);
    widest_tick = std::max(widest_tick, text_width(tick_text(snapped), layout.font_px));
  }
  layout.width = std::max(layout.bar.x + kBarWidth + kTickLength + 4 + widest_tick + kPad,
                          kPad + text_width(options.title, layout.title_font_px) + kPad);
  layout.height = std::max(layout.plot.y + layout.plot.height, layout.bar.y + layout.bar.height) +
                  kPad + layout.font_px / 2;
  return layout;
}

// Average advance of a sans-serif glyph, generous so that labels never collide.
int text_width(const std::string& text, int font_px) {
  std::size_t chars = 0;
  for (const char c : text) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return static_cast<int>(std::ceil(static_cast<double>(chars) * 0.62 * font_px));
}

double colour_position(const HeatmapLayout& layout, double value) {
  return (value - layout.range.low) / (layout.range.high - layout.range.low);
}

int bar_y(const HeatmapLayout& layout, double value) {
  const double t = colour_position(layout, value);
  return layout.bar.y + static_cast<int>(std::lround((1.0 - t) * (layout.bar.height - 1)));
}

std::string tick_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", value == 0.0 ? 0.0 : value);
  return text;
}

}  // namespace attn::viz
