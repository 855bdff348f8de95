// The PNG blend: the SVG's layout rasterised.
#include <cmath>
#include <string>

#include "viz/blend.hpp"
#include "viz/blend_layout.hpp"
#include "viz/colormap.hpp"
#include "viz/raster.hpp"

namespace attn::viz {
namespace {

constexpr Rgb kBackground{255, 255, 255};
constexpr Rgb kInk{34, 34, 34};
constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kFrame{85, 85, 85};
constexpr Rgb kBar{0xe4, 0x57, 0x2e};
constexpr Rgb kTrack{0xee, 0xee, 0xee};

void draw_cells(Raster& image, const BlendLayout& layout, const std::vector<double>& numbers, int x,
                int y) {
  for (std::size_t d = 0; d < numbers.size(); ++d) {
    const double t = blend_colour_position(layout, numbers[d]);
    const int left = x + static_cast<int>(d) * layout.cell_width;
    image.fill({left, y, layout.cell_width, layout.cell_height}, diverging_colour_at(t));
    if (layout.numbers) {
      image.text_centred(left + layout.cell_width / 2, y + layout.cell_height / 2,
                         cell_text(numbers[d]), layout.cell_font_px,
                         std::abs(t - 0.5) > 0.3 ? kWhite : kInk);
    }
  }
}

void draw_row(Raster& image, const BlendLayout& layout, std::size_t i, const BlendRow& row) {
  const int y = layout.row_y[i];
  const int middle = y + layout.cell_height / 2;
  image.text_right(layout.label_right, middle, row.label, layout.font_px, kInk);
  draw_cells(image, layout, row.value, layout.value_x, y);
  image.text_centred(layout.times_x, middle, "x", layout.font_px, kInk);
  const Box track{layout.bar_x, y + 4, layout.bar_length, layout.cell_height - 8};
  image.fill(track, kTrack);
  image.fill({track.x, track.y, static_cast<int>(std::lround(row.weight * layout.bar_length)),
              track.height},
             kBar);
  image.text_left(layout.bar_x + layout.bar_length + 6, middle, tick_text(row.weight),
                  layout.font_px, kInk);
  image.text_centred(layout.equals_x, middle, "=", layout.font_px, kInk);
  draw_cells(image, layout, row.scaled, layout.scaled_x, y);
}

void draw_colour_bar(Raster& image, const BlendLayout& layout) {
  const Box& bar = layout.colour_bar;
  for (int x = 0; x < bar.width; ++x) {
    image.fill({bar.x + x, bar.y, 1, bar.height},
               diverging_colour_at(static_cast<double>(x) / (bar.width - 1)));
  }
  image.frame(bar, kFrame);
  for (std::size_t i = 0; i < layout.ticks.size(); ++i) {
    const int x =
        bar.x + static_cast<int>(i) * (bar.width - 1) / static_cast<int>(layout.ticks.size() - 1);
    image.text_centred(x, bar.y + bar.height + 8, tick_text(layout.ticks[i]), layout.font_px, kInk);
  }
}

}  // namespace

std::string blend_png(const Blend& blend) {
  const BlendLayout layout = lay_out_blend(blend);
  Raster image(layout.width, layout.height, kBackground);
  image.text_left(12, layout.title_y - layout.title_font_px / 2, layout.title, layout.title_font_px,
                  kInk);
  image.text_centred(layout.value_x + layout.rows_width / 2, layout.header_y, "value v_i",
                     layout.font_px, kInk);
  image.text_centred(layout.bar_x + layout.bar_length / 2, layout.header_y, "weight alpha_i",
                     layout.font_px, kInk);
  image.text_centred(layout.scaled_x + layout.rows_width / 2, layout.header_y, "alpha_i v_i",
                     layout.font_px, kInk);
  for (std::size_t i = 0; i < blend.rows.size(); ++i) draw_row(image, layout, i, blend.rows[i]);
  image.fill({layout.scaled_x, layout.rule_y, layout.rows_width, 2}, kInk);
  image.text_right(layout.scaled_x - 8, layout.context_y + layout.cell_height / 2,
                   "C = sum of the rows", layout.font_px, kInk);
  draw_cells(image, layout, blend.context, layout.scaled_x, layout.context_y);
  draw_colour_bar(image, layout);
  return image.png();
}

}  // namespace attn::viz
