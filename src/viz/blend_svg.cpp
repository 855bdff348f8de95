// The SVG blend, written as text. Cells carry their exact numbers (data-value) and a
// tooltip; the HTML page shows the same numbers on hover.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "viz/blend.hpp"
#include "viz/blend_layout.hpp"
#include "viz/colormap.hpp"
#include "viz/markup.hpp"

namespace attn::viz {
namespace {

constexpr const char* kBarColour = "#e4572e";
constexpr const char* kTrackColour = "#eeeeee";
constexpr int kBarSegments = 40;

std::string exact(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// Dark cells get white numbers.
const char* ink_on(const BlendLayout& layout, double value) {
  return std::abs(blend_colour_position(layout, value) - 0.5) > 0.3 ? "#ffffff" : "#222222";
}

// One row of Dv cells of `kind` (value, scaled or context) at (x, y); row -1 for C.
void write_cells(std::ostream& out, const BlendLayout& layout, const char* kind, int row,
                 const std::string& label, const std::vector<double>& numbers, int x, int y) {
  for (std::size_t d = 0; d < numbers.size(); ++d) {
    const double value = numbers[d];
    const int left = x + static_cast<int>(d) * layout.cell_width;
    out << "<rect class=\"" << kind << "\" data-row=\"" << row << "\" data-col=\"" << d
        << "\" data-value=\"" << exact(value) << "\" x=\"" << left << "\" y=\"" << y
        << "\" width=\"" << layout.cell_width << "\" height=\"" << layout.cell_height
        << "\" fill=\"" << hex(diverging_colour_at(blend_colour_position(layout, value)))
        << "\"><title>" << xml_escaped(label) << ", " << kind << " [" << d << "]: " << exact(value)
        << "</title></rect>\n";
    if (layout.numbers) {
      out << "<text class=\"number\" x=\"" << left + layout.cell_width / 2 << "\" y=\""
          << y + layout.cell_height / 2 << "\" font-size=\"" << layout.cell_font_px
          << "\" text-anchor=\"middle\" dominant-baseline=\"central\" pointer-events=\"none\" "
             "fill=\""
          << ink_on(layout, value) << "\">" << cell_text(value) << "</text>\n";
    }
  }
}

void write_row(std::ostream& out, const BlendLayout& layout, int i, const BlendRow& row) {
  const int y = layout.row_y[static_cast<std::size_t>(i)];
  const int middle = y + layout.cell_height / 2;
  out << "<g class=\"blend-row\" data-row=\"" << i << "\" data-count=\"" << row.count << "\">\n"
      << "<text class=\"label\" x=\"" << layout.label_right << "\" y=\"" << middle
      << "\" text-anchor=\"end\" dominant-baseline=\"central\""
      << (row.count > 1 ? " font-style=\"italic\"" : "") << ">" << xml_escaped(row.label)
      << "</text>\n";
  write_cells(out, layout, "value", i, row.label, row.value, layout.value_x, y);
  out << "<text class=\"sign\" x=\"" << layout.times_x << "\" y=\"" << middle
      << "\" text-anchor=\"middle\" dominant-baseline=\"central\">\xC3\x97</text>\n"
      << "<rect class=\"track\" x=\"" << layout.bar_x << "\" y=\"" << y + 4 << "\" width=\""
      << layout.bar_length << "\" height=\"" << layout.cell_height - 8 << "\" fill=\""
      << kTrackColour << "\"/>\n"
      << "<rect class=\"weight\" data-row=\"" << i << "\" data-value=\"" << exact(row.weight)
      << "\" x=\"" << layout.bar_x << "\" y=\"" << y + 4 << "\" width=\""
      << std::lround(row.weight * layout.bar_length) << "\" height=\"" << layout.cell_height - 8
      << "\" fill=\"" << kBarColour << "\"><title>" << xml_escaped(row.label)
      << ", weight alpha: " << exact(row.weight) << "</title></rect>\n"
      << "<text class=\"weight-text\" x=\"" << layout.bar_x + layout.bar_length + 6 << "\" y=\""
      << middle << "\" dominant-baseline=\"central\">" << tick_text(row.weight) << "</text>\n"
      << "<text class=\"sign\" x=\"" << layout.equals_x << "\" y=\"" << middle
      << "\" text-anchor=\"middle\" dominant-baseline=\"central\">=</text>\n";
  write_cells(out, layout, "scaled", i, row.label, row.scaled, layout.scaled_x, y);
  out << "</g>\n";
}

// The bar is drawn in segments rather than with a gradient: an HTML page holds many blends,
// and a gradient's id would be shared by all of them, and lost with the step that hides it.
void write_colour_bar(std::ostream& out, const BlendLayout& layout) {
  const Box& bar = layout.colour_bar;
  out << "<g class=\"colour-bar\" shape-rendering=\"crispEdges\">\n";
  for (int i = 0; i < kBarSegments; ++i) {
    const int left = bar.x + i * bar.width / kBarSegments;
    const int right = bar.x + (i + 1) * bar.width / kBarSegments;
    out << "<rect x=\"" << left << "\" y=\"" << bar.y << "\" width=\"" << right - left
        << "\" height=\"" << bar.height << "\" fill=\""
        << hex(diverging_colour_at((i + 0.5) / kBarSegments)) << "\"/>\n";
  }
  out << "<rect x=\"" << bar.x << "\" y=\"" << bar.y << "\" width=\"" << bar.width << "\" height=\""
      << bar.height << "\" fill=\"none\" stroke=\"#555555\" stroke-width=\"0.5\"/>\n</g>\n"
      << "<g class=\"ticks\" text-anchor=\"middle\" dominant-baseline=\"hanging\">\n";
  for (std::size_t i = 0; i < layout.ticks.size(); ++i) {
    const int x =
        bar.x + static_cast<int>(i) * (bar.width - 1) / static_cast<int>(layout.ticks.size() - 1);
    out << "<text x=\"" << x << "\" y=\"" << bar.y + bar.height + 4 << "\">"
        << tick_text(layout.ticks[i]) << "</text>\n";
  }
  out << "</g>\n";
}

}  // namespace

std::string blend_svg_element(const Blend& blend) {
  const BlendLayout layout = lay_out_blend(blend);
  std::ostringstream out;
  out << "<svg class=\"blend\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << layout.width
      << "\" height=\"" << layout.height << "\" viewBox=\"0 0 " << layout.width << ' '
      << layout.height
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\""
      << layout.font_px << "\" fill=\"#222222\">\n"
      << "<rect class=\"background\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
      << "<text class=\"title\" x=\"12\" y=\"" << layout.title_y << "\" font-size=\""
      << layout.title_font_px << "\" font-weight=\"bold\">" << xml_escaped(layout.title)
      << "</text>\n"
      << "<g class=\"headers\" font-weight=\"bold\" text-anchor=\"middle\" "
         "dominant-baseline=\"central\">\n"
      << "<text x=\"" << layout.value_x + layout.rows_width / 2 << "\" y=\"" << layout.header_y
      << "\">value v_i</text>\n<text x=\"" << layout.bar_x + layout.bar_length / 2 << "\" y=\""
      << layout.header_y << "\">weight alpha_i</text>\n<text x=\""
      << layout.scaled_x + layout.rows_width / 2 << "\" y=\"" << layout.header_y
      << "\">alpha_i v_i</text>\n</g>\n";
  for (std::size_t i = 0; i < blend.rows.size(); ++i) {
    write_row(out, layout, static_cast<int>(i), blend.rows[i]);
  }
  out << "<line class=\"rule\" x1=\"" << layout.scaled_x << "\" y1=\"" << layout.rule_y
      << "\" x2=\"" << layout.scaled_x + layout.rows_width << "\" y2=\"" << layout.rule_y
      << "\" stroke=\"#222222\" stroke-width=\"1.5\"/>\n"
      << "<text class=\"label\" x=\"" << layout.scaled_x - 8 << "\" y=\""
      << layout.context_y + layout.cell_height / 2
      << "\" text-anchor=\"end\" dominant-baseline=\"central\" font-weight=\"bold\">"
         "C = sum of the rows</text>\n"
      << "<g class=\"context-row\">\n";
  write_cells(out, layout, "context", -1, "C", blend.context, layout.scaled_x, layout.context_y);
  out << "</g>\n";
  write_colour_bar(out, layout);
  out << "</svg>\n";
  return out.str();
}

std::string blend_svg(const Blend& blend) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + blend_svg_element(blend);
}

}  // namespace attn::viz
