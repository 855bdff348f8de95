// PNGs are encoded by libpng's simplified API, which reports errors by return value, so no
// longjmp crosses C++ frames.
#include "viz/raster.hpp"

#include <png.h>

#include "attn/error.hpp"
#include "viz/font.hpp"

namespace attn::viz {

Raster::Raster(int width, int height, Rgb background)
    : width_(width), height_(height), pixels_(static_cast<std::size_t>(3 * width * height)) {
  fill({0, 0, width, height}, background);
}

Rgb Raster::at(int x, int y) const {
  const std::size_t i = 3 * (static_cast<std::size_t>(y) * width_ + x);
  return {pixels_[i], pixels_[i + 1], pixels_[i + 2]};
}

void Raster::set(int x, int y, Rgb colour) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  const std::size_t i = 3 * (static_cast<std::size_t>(y) * width_ + x);
  pixels_[i] = colour.r;
  pixels_[i + 1] = colour.g;
  pixels_[i + 2] = colour.b;
}

void Raster::fill(const Box& box, Rgb colour) {
  for (int y = box.y; y < box.y + box.height; ++y) {
    for (int x = box.x; x < box.x + box.width; ++x) set(x, y, colour);
  }
}

void Raster::frame(const Box& box, Rgb colour) {
  fill({box.x, box.y, box.width, 1}, colour);
  fill({box.x, box.y + box.height - 1, box.width, 1}, colour);
  fill({box.x, box.y, 1, box.height}, colour);
  fill({box.x + box.width - 1, box.y, 1, box.height}, colour);
}

void Raster::blend(int x, int y, Rgb colour, std::uint8_t coverage) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_ || coverage == 0) return;
  const Rgb under = at(x, y);
  const auto mix = [coverage](std::uint8_t low, std::uint8_t high) {
    return static_cast<std::uint8_t>((low * (255 - coverage) + high * coverage + 127) / 255);
  };
  set(x, y, {mix(under.r, colour.r), mix(under.g, colour.g), mix(under.b, colour.b)});
}

int Raster::text_width(const std::string& text, int px) {
  return text_advance(text, px);
}

void Raster::text_left(int x, int y, const std::string& text, int px, Rgb colour) {
  const TextImage image = render_text(text, px);
  const int top = y + baseline_offset(px) - image.baseline;
  for (int row = 0; row < image.height; ++row) {
    for (int col = 0; col < image.width; ++col)
      blend(x + col, top + row, colour, image.at(col, row));
  }
}

void Raster::text_right(int x, int y, const std::string& text, int px, Rgb colour) {
  text_left(x - text_width(text, px), y, text, px, colour);
}

void Raster::text_centred(int x, int y, const std::string& text, int px, Rgb colour) {
  text_left(x - text_width(text, px) / 2, y, text, px, colour);
}

void Raster::text_up(int x, int y, const std::string& text, int px, Rgb colour) {
  // Turned anticlockwise: the text's columns run up the canvas and its rows run right.
  const TextImage image = render_text(text, px);
  const int left = x - (image.baseline - baseline_offset(px));
  for (int row = 0; row < image.height; ++row) {
    for (int col = 0; col < image.width; ++col)
      blend(left + row, y - col, colour, image.at(col, row));
  }
}

std::string Raster::png() const {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(width_);
  png.height = static_cast<png_uint_32>(height_);
  png.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  const auto row_stride = static_cast<png_int_32>(3 * width_);
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, pixels(), row_stride, nullptr)) {
    throw Error(std::string("png: cannot encode the picture: ") + png.message);
  }
  std::string bytes(size, '\0');
  if (!png_image_write_to_memory(&png, bytes.data(), &size, 0, pixels(), row_stride, nullptr)) {
    throw Error(std::string("png: cannot encode the picture: ") + png.message);
  }
  bytes.resize(size);
  return bytes;
}

}  // namespace attn::viz
