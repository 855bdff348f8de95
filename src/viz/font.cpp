// FreeType is not thread-safe per face, and the Python package may draw from several threads
// at once, so one face serves every call under one lock.
#include "viz/font.hpp"

#include <ft2build.h>
#include FT_FREETYPE_H

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "attn/error.hpp"
#include "viz/markup.hpp"

namespace attn::viz {
namespace {

constexpr const char* kDebianFont = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

// 26.6 fixed point (FreeType's sizes) -> whole pixels, rounded.
int pixels(FT_Pos value) {
  return static_cast<int>((value + 32) >> 6);
}

// Code points of valid UTF-8 (clean_utf8 has replaced anything else).
std::vector<char32_t> code_points(const std::string& text) {
  const std::string clean = clean_utf8(text);
  std::vector<char32_t> points;
  for (std::size_t i = 0; i < clean.size();) {
    const auto lead = static_cast<unsigned char>(clean[i]);
    const std::size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    char32_t point = length == 1 ? lead : lead & (0x7F >> length);
    for (std::size_t k = 1; k < length; ++k) {
      point = (point << 6) | (static_cast<unsigned char>(clean[i + k]) & 0x3F);
    }
    points.push_back(point);
    i += length;
  }
  return points;
}

class Face {
 public:
  explicit Face(const std::string& path) {
    const std::string advice =
        " (the PNG pictures draw their text in DejaVu Sans: install Debian's fonts-dejavu-core, "
        "or set ATTN_FONT to a .ttf file)";
    if (!std::filesystem::is_regular_file(path)) {
      throw Error("font: no font file at '" + path + "'" + advice);
    }
    if (FT_Init_FreeType(&library_) != 0) throw Error("font: FreeType did not start");
    if (const FT_Error error = FT_New_Face(library_, path.c_str(), 0, &face_); error != 0) {
      FT_Done_FreeType(library_);
      throw Error("font: cannot read '" + path + "' as a font (FreeType error " +
                  std::to_string(error) + ")" + advice);
    }
  }
  Face(const Face&) = delete;
  Face& operator=(const Face&) = delete;
  ~Face() {
    FT_Done_Face(face_);
    FT_Done_FreeType(library_);
  }

  // The face at `px` per em, for the caller holding `mutex`.
  FT_Face at_size(int px) {
    if (FT_Set_Pixel_Sizes(face_, 0, static_cast<FT_UInt>(std::max(px, 1))) != 0) {
      throw Error("font: cannot size the font to " + std::to_string(px) + " px");
    }
    return face_;
  }

  std::mutex mutex;

 private:
  FT_Library library_ = nullptr;
  FT_Face face_ = nullptr;
};

// Opened on first use; a failed open throws and is tried again on the next call.
Face& face() {
  static Face opened(font_path());
  return opened;
}

// The glyph of `point` loaded into face->glyph; rendered to coverage when `render`.
void load(FT_Face face, char32_t point, bool render) {
  const FT_Int32 flags = FT_LOAD_TARGET_LIGHT | (render ? FT_LOAD_RENDER : FT_LOAD_DEFAULT);
  if (FT_Load_Char(face, point, flags) != 0 && FT_Load_Glyph(face, 0, flags) != 0) {
    char code[16];
    std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(point));
    throw Error(std::string("font: cannot load a glyph for ") + code);
  }
}

}  // namespace

std::string font_path() {
  const char* chosen = std::getenv("ATTN_FONT");
  return chosen && *chosen ? chosen : kDebianFont;
}

TextImage render_text(const std::string& text, int px) {
  const std::vector<char32_t> points = code_points(text);
  Face& font = face();
  const std::lock_guard lock(font.mutex);
  const FT_Face face = font.at_size(px);
  TextImage image;
  image.baseline = pixels(face->size->metrics.ascender);
  image.height = image.baseline - pixels(face->size->metrics.descender);
  for (const char32_t point : points) {
    load(face, point, false);
    image.width += pixels(face->glyph->advance.x);
  }
  image.coverage.assign(static_cast<std::size_t>(image.width) * image.height, 0);
  int pen = 0;
  for (const char32_t point : points) {
    load(face, point, true);
    const FT_GlyphSlot glyph = face->glyph;
    const FT_Bitmap& bitmap = glyph->bitmap;
    for (int row = 0; row < static_cast<int>(bitmap.rows); ++row) {
      const int y = image.baseline - glyph->bitmap_top + row;
      if (y < 0 || y >= image.height) continue;
      for (int col = 0; col < static_cast<int>(bitmap.width); ++col) {
        const int x = pen + glyph->bitmap_left + col;
        if (x < 0 || x >= image.width) continue;
        std::uint8_t& cell = image.coverage[static_cast<std::size_t>(y) * image.width + x];
        cell = std::max(cell, bitmap.buffer[row * bitmap.pitch + col]);
      }
    }
    pen += pixels(glyph->advance.x);
  }
  return image;
}

int text_advance(const std::string& text, int px) {
  const std::vector<char32_t> points = code_points(text);
  Face& font = face();
  const std::lock_guard lock(font.mutex);
  const FT_Face face = font.at_size(px);
  int width = 0;
  for (const char32_t point : points) {
    load(face, point, false);
    width += pixels(face->glyph->advance.x);
  }
  return width;
}

int baseline_offset(int px) {
  Face& font = face();
  const std::lock_guard lock(font.mutex);
  const FT_Face face = font.at_size(px);
  return (pixels(face->size->metrics.ascender) + pixels(face->size->metrics.descender)) / 2;
}

}  // namespace attn::viz
