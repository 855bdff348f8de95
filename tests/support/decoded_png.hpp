// A PNG file decoded to RGB by libpng, for the tests that check drawn pictures pixel by
// pixel. Header-only so that only the tests that link libpng need it.
#pragma once

#include <gtest/gtest.h>
#include <png.h>

#include <string>
#include <vector>

#include "viz/colormap.hpp"

namespace attn::testing {

struct DecodedPng {
  int width = 0, height = 0;
  std::vector<unsigned char> rgb;
  viz::Rgb at(int x, int y) const {
    const std::size_t i = 3 * (static_cast<std::size_t>(y) * width + x);
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

// The bytes of a PNG file -> its pixels; a test failure (and an empty image) otherwise.
inline DecodedPng decode_png(const std::string& bytes) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    ADD_FAILURE() << "not a PNG: " << image.message;
    return {};
  }
  image.format = PNG_FORMAT_RGB;
  DecodedPng decoded{static_cast<int>(image.width), static_cast<int>(image.height), {}};
  decoded.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, decoded.rgb.data(), 0, nullptr)) {
    ADD_FAILURE() << "PNG does not decode: " << image.message;
  }
  return decoded;
}

}  // namespace attn::testing
