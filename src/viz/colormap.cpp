#include "viz/colormap.hpp"

#include <algorithm>
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

// ColorBrewer's RdBu (Apache-2.0), eleven classes from blue to red, so that 0.5 falls on
// its white anchor exactly.
constexpr std::array<const char*, 11> kDivergingAnchors = {
    "#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7",
    "#fddbc7", "#f4a582", "#d6604d", "#b2182b", "#67001f"};

Rgb parse_hex(const char* text) {
  unsigned r = 0, g = 0, b = 0;
  std::sscanf(text, "#%02x%02x%02x", &r, &g, &b);
  return {static_cast<std::uint8_t>(r), static_cast<std::uint8_t>(g), static_cast<std::uint8_t>(b)};
}

// `anchors` as colours.
template <std::size_t N>
std::array<Rgb, N> parse_all(const std::array<const char*, N>& anchors) {
  std::array<Rgb, N> parsed{};
  for (std::size_t i = 0; i < N; ++i) parsed[i] = parse_hex(anchors[i]);
  return parsed;
}

std::uint8_t mix(std::uint8_t a, std::uint8_t b, double f) {
  return static_cast<std::uint8_t>(std::lround(a + (b - a) * f));
}

// t in [0, 1] -> linear interpolation between equally spaced `anchors`.
template <std::size_t N>
Rgb interpolate(const std::array<Rgb, N>& anchors, double t) {
  const double position = t * static_cast<double>(anchors.size() - 1);
  const auto low = static_cast<std::size_t>(position);
  if (low + 1 >= anchors.size()) return anchors.back();
  const double f = position - static_cast<double>(low);
  const Rgb a = anchors[low], b = anchors[low + 1];
  return {mix(a.r, b.r, f), mix(a.g, b.g, f), mix(a.b, b.b, f)};
}

}  // namespace

Rgb colour_at(double t) {
  static const auto anchors = parse_all(kAnchors);
  if (!(t > 0.0)) t = 0.0;
  return interpolate(anchors, std::min(t, 1.0));
}

Rgb diverging_colour_at(double t) {
  static const auto anchors = parse_all(kDivergingAnchors);
  if (std::isnan(t)) t = 0.5;
  return interpolate(anchors, std::clamp(t, 0.0, 1.0));
}

std::string hex(Rgb colour) {
  char text[8];
  std::snprintf(text, sizeof text, "#%02x%02x%02x", colour.r, colour.g, colour.b);
  return text;
}

std::span<const char* const> colour_anchors() {
  return kAnchors;
}

const char* const kColourScript = R"JS(
"use strict";
function colourMap(hexAnchors) {
  const anchors = hexAnchors.map(h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)));
  return t => {
    t = Math.min(1, Math.max(0, t || 0));
    const p = t * (anchors.length - 1), low = Math.floor(p);
    if (low >= anchors.length - 1) return anchors[anchors.length - 1];
    const f = p - low, a = anchors[low], b = anchors[low + 1];
    return [0, 1, 2].map(i => Math.round(a[i] + (b[i] - a[i]) * f));
  };
}
)JS";

}  // namespace attn::viz
