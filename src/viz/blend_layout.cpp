#include "viz/blend_layout.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace attn::viz {
namespace {

constexpr int kPad = 12;
constexpr int kRowGap = 4;
constexpr int kSignWidth = 28;  // the "x" and "=" columns
constexpr int kBarLength = 90;
// Vectors this short have their numbers printed in wide cells; longer ones get narrower
// cells, the numbers left to the tooltips and the HTML page.
constexpr std::size_t kMostPrintedCells = 10;
constexpr int kNumberCellWidth = 50;
constexpr int kRowsTarget = 480;
constexpr int kWidestCell = 30;

}  // namespace

BlendLayout lay_out_blend(const Blend& blend) {
  BlendLayout layout;
  layout.title = blend.title;
  const std::size_t dim_v = blend.context.size();
  layout.numbers = dim_v <= kMostPrintedCells;
  layout.cell_width = layout.numbers
                          ? kNumberCellWidth
                          : std::clamp(kRowsTarget / static_cast<int>(dim_v), 1, kWidestCell);
  layout.cell_height = layout.numbers ? 24 : 20;
  layout.rows_width = static_cast<int>(dim_v) * layout.cell_width;

  // One scale for every cell, symmetric about 0, so that equal colours are equal numbers
  // wherever they are and white is always 0.
  double largest = 0.0;
  const auto widen = [&](const std::vector<double>& xs) {
    for (const double x : xs) largest = std::max(largest, std::abs(x));
  };
  for (const BlendRow& row : blend.rows) {
    widen(row.value);
    widen(row.scaled);
  }
  widen(blend.context);
  layout.scale = largest > 0.0 ? largest : 1.0;
  layout.ticks = {-layout.scale, 0.0, layout.scale};

  int widest_label = text_width("C", layout.font_px);
  for (const BlendRow& row : blend.rows) {
    widest_label = std::max(widest_label, text_width(row.label, layout.font_px));
  }
  layout.title_y = kPad + layout.title_font_px;
  layout.header_y = layout.title_y + 12 + layout.font_px / 2;
  layout.label_right = kPad + widest_label;
  layout.value_x = layout.label_right + 8;
  layout.times_x = layout.value_x + layout.rows_width + kSignWidth / 2;
  layout.bar_x = layout.times_x + kSignWidth / 2;
  layout.bar_length = kBarLength;
  // Room for the widest weight as printed beside its bar ("0.000697" is wider than "0.01").
  int widest_weight = text_width("0.0000", layout.font_px);
  for (const BlendRow& row : blend.rows) {
    widest_weight = std::max(widest_weight, text_width(tick_text(row.weight), layout.font_px));
  }
  layout.equals_x = layout.bar_x + kBarLength + 6 + widest_weight + kSignWidth / 2;
  layout.scaled_x = layout.equals_x + kSignWidth / 2;

  const int first_row = layout.header_y + layout.font_px / 2 + 8;
  for (std::size_t i = 0; i < blend.rows.size(); ++i) {
    layout.row_y.push_back(first_row + static_cast<int>(i) * (layout.cell_height + kRowGap));
  }
  const int rows_end = blend.rows.empty() ? first_row : layout.row_y.back() + layout.cell_height;
  layout.rule_y = rows_end + 5;
  layout.context_y = layout.rule_y + 6;
  layout.colour_bar = {layout.value_x, layout.context_y + layout.cell_height + 22,
                       std::max(layout.rows_width, 160), 10};
  layout.height = layout.colour_bar.y + layout.colour_bar.height + 8 + layout.font_px + kPad;
  layout.width = std::max({layout.scaled_x + layout.rows_width + kPad,
                           layout.colour_bar.x + layout.colour_bar.width + kPad,
                           kPad + text_width(blend.title, layout.title_font_px) + kPad});
  return layout;
}

double blend_colour_position(const BlendLayout& layout, double value) {
  return 0.5 + value / (2.0 * layout.scale);
}

std::string cell_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", value);
  // "-0.00" says no more than "0.00".
  return std::string(text) == "-0.00" ? "0.00" : text;
}

}  // namespace attn::viz
