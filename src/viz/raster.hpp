// A small RGB canvas for the PNG pictures: filled boxes, and text in DejaVu Sans drawn by
// FreeType (viz/font.hpp), blended into the canvas by its anti-aliased coverage.
#pragma once

#include <cstdint>
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

  // Text `px` pixels per em, vertically centred on `y`: starting at x, ending at x, or
  // centred on x. Throws attn::Error when the font cannot be read (viz/font.hpp).
  void text_left(int x, int y, const std::string& text, int px, Rgb colour);
  void text_right(int x, int y, const std::string& text, int px, Rgb colour);
  void text_centred(int x, int y, const std::string& text, int px, Rgb colour);
  // Text turned a quarter anticlockwise, reading upwards from y, centred on x.
  void text_up(int x, int y, const std::string& text, int px, Rgb colour);

  static int text_width(const std::string& text, int px);

  // The canvas as the bytes of an 8-bit RGB PNG file.
  std::string png() const;

 private:
  void set(int x, int y, Rgb colour);
  // `colour` over the pixel at x, y with opacity coverage / 255.
  void blend(int x, int y, Rgb colour, std::uint8_t coverage);

  int width_, height_;
  std::vector<unsigned char> pixels_;
};

}  // namespace attn::viz
