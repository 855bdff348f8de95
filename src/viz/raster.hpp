// A small RGB canvas for the PNG pictures: filled boxes and text in a built-in 5 x 7 pixel
// font, so that PNGs need no font files or rendering library.
#pragma once

#include <string>
#include <vector>

#include "viz/colormap.hpp"
#include "viz/heatmap_layout.hpp"

namespace attn::viz {

class Raster {
 public:
  Raster(int width, int height, Rgb background);

  // Row-major RGB bytes, 3 * width per row.
  const unsigned char* pixels() const { return pixels_.data(); }
  Rgb at(int x, int y) const;

  // Everything is clipped to the canvas.
  void fill(const Box& box, Rgb colour);
  void frame(const Box& box, Rgb colour);

  // Text one glyph per code point (a box for those outside ASCII), vertically centred on
  // `y`: starting at x, ending at x, or centred on x.
  void text_left(int x, int y, const std::string& text, Rgb colour);
  void text_right(int x, int y, const std::string& text, Rgb colour);
  void text_centred(int x, int y, const std::string& text, Rgb colour);
  // Text turned a quarter anticlockwise, reading upwards from y, centred on x.
  void text_up(int x, int y, const std::string& text, Rgb colour);

  static int text_width(const std::string& text);

  // The canvas as the bytes of an 8-bit RGB PNG file.
  std::string png() const;

 private:
  void set(int x, int y, Rgb colour);
  template <class Place>
  void draw_text(const std::string& text, Rgb colour, Place place);

  int width_, height_;
  std::vector<unsigned char> pixels_;
};

}  // namespace attn::viz
