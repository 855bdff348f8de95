// PNG text through FreeType and DejaVu Sans: glyphs have their own widths ("iii" is
// narrower than "WWW"), text leaves anti-aliased ink where it is drawn and nowhere else, and
// turned text runs up the canvas.
#include <gtest/gtest.h>

#include <string>

#include "viz/font.hpp"
#include "viz/raster.hpp"

namespace attn::viz {
namespace {

constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kInk{34, 34, 34};

// Pixels that are not background inside `box`, and those of a shade between ink and
// background (anti-aliased edges, which a bitmap font never has).
struct Ink {
  int any = 0, grey = 0;
};

Ink ink_in(const Raster& image, const Box& box) {
  Ink ink;
  for (int y = box.y; y < box.y + box.height; ++y) {
    for (int x = box.x; x < box.x + box.width; ++x) {
      const Rgb pixel = image.at(x, y);
      ink.any += pixel != kWhite;
      ink.grey += pixel != kWhite && pixel != kInk;
    }
  }
  return ink;
}

TEST(Font, GlyphsHaveTheirOwnWidths) {
  EXPECT_EQ(font_path().empty(), false);
  const int narrow = Raster::text_width("iii", 14), wide = Raster::text_width("WWW", 14);
  EXPECT_GT(narrow, 0);
  EXPECT_GT(wide, 2 * narrow) << "a fixed-width (bitmap) font gives both the same width";
  EXPECT_GT(Raster::text_width("WWW", 28), Raster::text_width("WWW", 14) * 3 / 2);
  EXPECT_EQ(Raster::text_width("", 14), 0);
  const TextImage image = render_text("Wg", 20);
  EXPECT_EQ(image.width, Raster::text_width("Wg", 20));
  EXPECT_GT(image.height, 20);
  EXPECT_GT(image.baseline, image.height / 2) << "room for the descender of g below";
}

TEST(Font, TextIsPaintedInItsBoxOnly) {
  Raster image(200, 60, kWhite);
  image.text_left(10, 30, "Attention", 16, kInk);
  const int width = Raster::text_width("Attention", 16);
  const Ink inside = ink_in(image, {10, 30 - 12, width, 24});
  EXPECT_GT(inside.any, 100);
  EXPECT_GT(inside.grey, 20) << "no anti-aliased pixels: not a real font";
  EXPECT_EQ(ink_in(image, {0, 0, 200, 14}).any, 0) << "ink above the line";
  EXPECT_EQ(ink_in(image, {12 + width, 0, 200 - 12 - width, 60}).any, 0) << "ink past the end";
}

TEST(Font, RightCentredAndTurnedTextLandWhereAsked) {
  Raster image(300, 300, kWhite);
  const int width = Raster::text_width("query", 14);
  image.text_right(290, 20, "query", 14, kInk);
  EXPECT_GT(ink_in(image, {290 - width, 10, width, 20}).any, 40);
  EXPECT_EQ(ink_in(image, {0, 0, 288 - width, 40}).any, 0);
  image.text_centred(150, 60, "key", 14, kInk);
  const int key = Raster::text_width("key", 14);
  EXPECT_GT(ink_in(image, {150 - key / 2, 50, key, 20}).any, 20);
  // Turned: reads upwards from y = 280, a column about the font's height wide at x = 100.
  image.text_up(100, 280, "WWWWW", 14, kInk);
  const int tall = Raster::text_width("WWWWW", 14);
  EXPECT_GT(ink_in(image, {90, 280 - tall, 20, tall}).any, 100);
  EXPECT_EQ(ink_in(image, {0, 100, 85, 200}).any, 0);
  EXPECT_EQ(ink_in(image, {115, 100, 185, 200}).any, 0);
}

TEST(Font, AnyBytesDrawWithoutFailing) {
  Raster image(100, 30, kWhite);
  image.text_left(2, 15, std::string("caf\xC3\xA9 \xFF\xFE \xE2\x82", 11), 12, kInk);
  image.text_left(2, 15, "\xF0\x9F\x98\x80", 12, kInk);  // outside DejaVu Sans: its box glyph
  EXPECT_GT(ink_in(image, {0, 0, 100, 30}).any, 20);
}

}  // namespace
}  // namespace attn::viz
