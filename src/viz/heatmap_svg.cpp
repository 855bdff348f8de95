// The SVG heatmap, written as text: one <rect> per cell in <g class="cells">, in row-major
// order, so that a reader (or a test) can map cells back to weights.
#include <sstream>

#include "viz/colormap.hpp"
#include "viz/heatmap.hpp"
#include "viz/heatmap_layout.hpp"
#include "viz/markup.hpp"

namespace attn::viz {
namespace {

// Tooltips name each cell's query and key; past this many cells they would only bloat the
// file, since a reader cannot point at one cell anyway.
constexpr Index kMostTooltips = 64 * 64;

std::string label_of(const std::vector<std::string>& tokens, Index first, Index block,
                     Index count) {
  const Index last = std::min(first + block, count) - 1;
  std::string text = std::to_string(first) + (last > first ? ".." + std::to_string(last) : "");
  if (!tokens.empty() && last == first) text += " " + tokens[static_cast<std::size_t>(first)];
  return text;
}

void write_cells(std::ostream& out, const HeatmapLayout& layout, const Matrix& weights,
                 const HeatmapOptions& options) {
  const Matrix& cells = layout.blocks.cells;
  const bool tooltips = cells.rows * cells.cols <= kMostTooltips;
  out << "<g class=\"cells\" shape-rendering=\"crispEdges\">\n";
  for (Index r = 0; r < cells.rows; ++r) {
    for (Index c = 0; c < cells.cols; ++c) {
      out << "<rect x=\"" << layout.plot.x + c * layout.cell_width << "\" y=\""
          << layout.plot.y + r * layout.cell_height << "\" width=\"" << layout.cell_width
          << "\" height=\"" << layout.cell_height << "\" fill=\""
          << hex(colour_at(colour_position(layout, cells(r, c)))) << '"';
      if (!tooltips) {
        out << "/>\n";
        continue;
      }
      out << "><title>query "
          << xml_escaped(label_of(options.row_labels, r * layout.blocks.row_block,
                                  layout.blocks.row_block, weights.rows))
          << ", key "
          << xml_escaped(label_of(options.column_labels, c * layout.blocks.col_block,
                                  layout.blocks.col_block, weights.cols))
          << ": " << tick_text(cells(r, c)) << "</title></rect>\n";
    }
  }
  out << "</g>\n";
}

void write_labels(std::ostream& out, const HeatmapLayout& layout) {
  const Box& plot = layout.plot;
  out << "<g class=\"row-labels\" text-anchor=\"end\" dominant-baseline=\"central\">\n";
  for (const AxisLabel& label : layout.row_labels) {
    out << "<text x=\"" << plot.x - 6 << "\" y=\"" << plot.y + label.offset << "\">"
        << xml_escaped(label.text) << "</text>\n";
  }
  out << "</g>\n<g class=\"column-labels\" text-anchor=\"start\" dominant-baseline=\"central\">\n";
  for (const AxisLabel& label : layout.column_labels) {
    out << "<text transform=\"translate(" << plot.x + label.offset << " " << plot.y - 6
        << ") rotate(-90)\">" << xml_escaped(label.text) << "</text>\n";
  }
  out << "</g>\n";
  out << "<text class=\"axis-title\" font-weight=\"bold\" text-anchor=\"middle\" x=\""
      << plot.x + plot.width / 2 << "\" y=\"" << layout.key_title_y << "\">key</text>\n";
  out << "<text class=\"axis-title\" font-weight=\"bold\" text-anchor=\"middle\" "
         "transform=\"translate("
      << layout.query_title_x << " " << plot.y + plot.height / 2
      << ") rotate(-90)\">query</text>\n";
}

void write_colour_bar(std::ostream& out, const HeatmapLayout& layout) {
  const Box& bar = layout.bar;
  const auto anchors = colour_anchors();
  out << "<defs><linearGradient id=\"colour-scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n";
  for (std::size_t i = 0; i < anchors.size(); ++i) {
    out << "<stop offset=\"" << static_cast<double>(i) / static_cast<double>(anchors.size() - 1)
        << "\" stop-color=\"" << anchors[i] << "\"/>\n";
  }
  out << "</linearGradient></defs>\n";
  out << "<rect class=\"colour-bar\" x=\"" << bar.x << "\" y=\"" << bar.y << "\" width=\""
      << bar.width << "\" height=\"" << bar.height
      << "\" fill=\"url(#colour-scale)\" stroke=\"#555555\" stroke-width=\"0.5\"/>\n";
  out << "<g class=\"ticks\" dominant-baseline=\"central\">\n";
  for (const double tick : layout.ticks) {
    const int y = bar_y(layout, tick);
    out << "<line x1=\"" << bar.x + bar.width << "\" y1=\"" << y << "\" x2=\""
        << bar.x + bar.width + 4 << "\" y2=\"" << y << "\" stroke=\"#333333\"/>\n"
        << "<text x=\"" << bar.x + bar.width + 7 << "\" y=\"" << y << "\">" << tick_text(tick)
        << "</text>\n";
  }
  out << "</g>\n";
}

}  // namespace

// weights: [Lq, Lk]
std::string heatmap_svg(const Matrix& weights, const HeatmapOptions& options) {
  const HeatmapLayout layout = lay_out_heatmap(weights, options);
  std::ostringstream out;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << layout.width << "\" height=\""
      << layout.height << "\" viewBox=\"0 0 " << layout.width << ' ' << layout.height
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\""
      << layout.font_px << "\" fill=\"#222222\">\n"
      << "<rect class=\"background\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  if (!layout.title.empty()) {
    out << "<text class=\"title\" x=\"12\" y=\"" << layout.title_y << "\" font-size=\""
        << layout.title_font_px << "\" font-weight=\"bold\">" << xml_escaped(layout.title)
        << "</text>\n";
  }
  write_cells(out, layout, weights, options);
  write_labels(out, layout);
  write_colour_bar(out, layout);
  out << "</svg>\n";
  return out.str();
}

}  // namespace attn::viz
