#include "viz/cache_blocks.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "attn/error.hpp"
#include "viz/colormap.hpp"
#include "viz/heatmap_layout.hpp"
#include "viz/markup.hpp"

namespace attn::viz {
namespace {

constexpr int kPad = 12;
constexpr int kSlotWidth = 72, kSlotHeight = 46;
constexpr int kBlockGap = 14;
constexpr int kBlockHeader = 18;
constexpr int kFontPx = 12;

}  // namespace

std::string cache_blocks_svg_element(const CacheBlocks& cache) {
  const auto cached = static_cast<Index>(cache.tokens.size());
  if (static_cast<Index>(cache.weights.size()) != cached) {
    throw Error("weights: expected one per cached token (" + std::to_string(cached) + "), given " +
                std::to_string(cache.weights.size()));
  }
  if (cache.page_size < 1) {
    throw Error("page_size: expected at least 1, given " + std::to_string(cache.page_size));
  }
  const auto blocks = static_cast<Index>(cache.block_table.size());
  if (blocks != (cached + cache.page_size - 1) / cache.page_size) {
    throw Error("block_table: expected ceil(" + std::to_string(cached) + " / " +
                std::to_string(cache.page_size) + ") blocks, given " + std::to_string(blocks));
  }
  const std::string title = "KV cache: " + std::to_string(cached) +
                            (cached == 1 ? " token" : " tokens") + " in " + std::to_string(blocks) +
                            (blocks == 1 ? " block" : " blocks") + " of " +
                            std::to_string(cache.page_size);
  const char* note = "colour and number: the new query's weight on each cached token";
  const int block_width = static_cast<int>(cache.page_size) * kSlotWidth + 8;
  const int title_y = kPad + kFontPx;
  const int note_y = title_y + kFontPx + 4;
  const int top = note_y + 10;
  const int width = std::max(2 * kPad + static_cast<int>(blocks) * (block_width + kBlockGap),
                             2 * kPad + text_width(note, kFontPx));
  const int height = top + kBlockHeader + kSlotHeight + 8 + kPad;
  std::ostringstream out;
  out << "<svg class=\"cache-blocks\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width
      << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << ' ' << height
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"" << kFontPx
      << "\" fill=\"#222222\">\n"
      << "<text class=\"title\" x=\"" << kPad << "\" y=\"" << title_y << "\" font-weight=\"bold\">"
      << title << "</text>\n<text x=\"" << kPad << "\" y=\"" << note_y << "\" fill=\"#555555\">"
      << note << "</text>\n";
  for (Index b = 0; b < blocks; ++b) {
    const int x = kPad + static_cast<int>(b) * (block_width + kBlockGap);
    out << "<g class=\"block\" data-block=\"" << cache.block_table[static_cast<std::size_t>(b)]
        << "\">\n<rect x=\"" << x << "\" y=\"" << top << "\" width=\"" << block_width
        << "\" height=\"" << kBlockHeader + kSlotHeight + 8
        << "\" fill=\"#f4f4f4\" stroke=\"#888888\"/>\n<text x=\"" << x + 4 << "\" y=\""
        << top + kBlockHeader / 2 + 1 << "\" dominant-baseline=\"central\" font-size=\"11\">block "
        << cache.block_table[static_cast<std::size_t>(b)] << "</text>\n";
    for (Index s = 0; s < cache.page_size; ++s) {
      const Index position = b * cache.page_size + s;
      const int slot_x = x + 4 + static_cast<int>(s) * kSlotWidth;
      const int slot_y = top + kBlockHeader;
      if (position >= cached) {
        out << "<rect class=\"empty\" x=\"" << slot_x << "\" y=\"" << slot_y << "\" width=\""
            << kSlotWidth - 4 << "\" height=\"" << kSlotHeight
            << "\" fill=\"#ffffff\" stroke=\"#aaaaaa\" stroke-dasharray=\"4 3\"/>\n";
        continue;
      }
      const double weight = cache.weights[static_cast<std::size_t>(position)];
      const std::string& token = cache.tokens[static_cast<std::size_t>(position)];
      const char* ink = weight < 0.6 ? "#ffffff" : "#222222";  // viridis is dark below 0.6
      char exact[32];
      std::snprintf(exact, sizeof exact, "%.17g", weight);
      out << "<rect class=\"slot\" data-position=\"" << position << "\" data-value=\"" << exact
          << "\" x=\"" << slot_x << "\" y=\"" << slot_y << "\" width=\"" << kSlotWidth - 4
          << "\" height=\"" << kSlotHeight << "\" fill=\"" << hex(colour_at(weight)) << "\"><title>"
          << position << ' ' << xml_escaped(token) << ", weight: " << exact
          << "</title></rect>\n<text x=\"" << slot_x + (kSlotWidth - 4) / 2 << "\" y=\""
          << slot_y + 15 << "\" text-anchor=\"middle\" dominant-baseline=\"central\" fill=\"" << ink
          << "\" pointer-events=\"none\">" << xml_escaped(shortened(token, 9))
          << "</text>\n<text x=\"" << slot_x + (kSlotWidth - 4) / 2 << "\" y=\"" << slot_y + 33
          << "\" text-anchor=\"middle\" dominant-baseline=\"central\" font-size=\"11\" fill=\""
          << ink << "\" pointer-events=\"none\">" << tick_text(weight) << "</text>\n";
    }
    out << "</g>\n";
  }
  out << "</svg>\n";
  return out.str();
}

}  // namespace attn::viz
