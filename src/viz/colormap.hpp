// The colour maps of every picture. Weights (>= 0) use viridis, perceptually uniform and
// readable in grey and by colour-blind readers, so equal steps in weight look like equal
// steps in colour. Values of either sign (value and context vectors) use a diverging map,
// blue below zero, white at zero and red above, so a cell's sign reads at a glance.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace attn::viz {

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

// t in [0, 1] (clamped; NaN reads as 0) -> dark purple (0) .. yellow (1).
Rgb colour_at(double t);

// "#rrggbb"
std::string hex(Rgb colour);

// The anchors colour_at interpolates between, as "#rrggbb" from t = 0 to t = 1 in equal
// steps; the HTML page's script uses the same table.
std::span<const char* const> colour_anchors();

// colour_at in JavaScript for the HTML pages, in a <script> of its own before the page's:
// colourMap(anchors) takes colour_anchors() as the page's data holds them and returns
// t -> [r, g, b], interpolated as colour_at does.
extern const char* const kColourScript;

// t in [0, 1] (clamped; NaN reads as 0.5) -> dark blue (0) .. white (0.5) .. dark red (1).
Rgb diverging_colour_at(double t);

}  // namespace attn::viz
