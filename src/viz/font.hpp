// Text for the PNG pictures: DejaVu Sans, rasterised by FreeType into 8-bit coverage. The
// font file is found at run time: $ATTN_FONT, else Debian's fonts-dejavu-core path. A fixed
// file rather than fontconfig's choice, so that a picture (and the tests that read its
// pixels) comes out the same on every machine that has the package.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn::viz {

// One line of text drawn into a coverage bitmap, 0 (background) .. 255 (ink), row-major.
struct TextImage {
  int width = 0, height = 0;
  int baseline = 0;  // rows from the top to the baseline
  std::vector<std::uint8_t> coverage;
  std::uint8_t at(int x, int y) const {
    return coverage[static_cast<std::size_t>(y) * static_cast<std::size_t>(width) +
                    static_cast<std::size_t>(x)];
  }
};

// The font file to use: $ATTN_FONT when set, else
// /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf. It is opened once, by the first text
// drawn in the process; later changes to $ATTN_FONT do not reopen it.
std::string font_path();

// `text` (UTF-8; invalid bytes read as U+FFFD) at `px` pixels per em. Throws attn::Error
// naming the font when the file is missing or unreadable.
TextImage render_text(const std::string& text, int px);

// The advance width of `text` at `px` pixels per em, in px.
int text_advance(const std::string& text, int px);

// How far below a line's vertical centre its baseline sits at `px`: half of the ascender
// less the descender, so that text centred on y looks centred.
int baseline_offset(int px);

}  // namespace attn::viz
