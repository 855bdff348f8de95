#include "viz/colormap.hpp"

#include <array>
#include <cmath>
#include <cstdio>

namespace attn::viz {
namespace {

// matplotlib's viridis (CC0) sampled at ten equal steps; linear interpolation between
// neighbours stays within 2/255 of the full 256-entry table.
constexpr std::array<const char*, 10> kAnchors = {"#440154", "#482878", "#3e4989", "#31688e",
                                                  "#26828e", "#1f9e89", "#35b779", "#6ece58",
                                                  "#b5de2b", "#fde725"};

Rgb parse_hex(const char* text) {
  unsigned r = 0, g = 0, b = 0;
  std::sscanf(text, "#%02x%02x%02x", &r, &g, &b);
  return {static_cast<std::uint8_t>(r), static_cast<std::uint8_t>(g), static_cast<std::uint8_t>(b)};
}

// kAnchors as colours, parsed once.
const std::array<Rgb, kAnchors.size()>& anchor_colours() {
  static const std::array<Rgb, kAnchors.size()> colours = [] {
    std::array<Rgb, kAnchors.size()> parsed{};
    for (std::size_t i = 0; i < kAnchors.size(); ++i) parsed[i] = parse_hex(kAnchors[i]);
    return parsed;
  }();
  return colours;
}

std::uint8_t mix(std::uint8_t a, std::uint8_t b, double f) {
  return static_cast<std::uint8_t>(std::lround(a + (b - a) * f));
}

}  // namespace

Rgb colour_at(double t) {
  if (!(t > 0.0)) t = 0.0;
  if (t > 1.0) t = 1.0;
  const auto& anchors = anchor_colours();
  const double position = t * static_cast<double>(anchors.size() - 1);
  const auto low = static_cast<std::size_t>(position);
  if (low + 1 >= anchors.size()) return anchors.back();
  const double f = position - static_cast<double>(low);
  const Rgb a = anchors[low], b = anchors[low + 1];
  return {mix(a.r, b.r, f), mix(a.g, b.g, f), mix(a.b, b.b, f)};
}

std::string hex(Rgb colour) {
  char text[8];
  std::snprintf(text, sizeof text, "#%02x%02x%02x", colour.r, colour.g, colour.b);
  return text;
}

std::span<const char* const> colour_anchors() {
  return kAnchors;
}

}  // namespace attn::viz
