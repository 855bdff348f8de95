// The colour map of every picture: viridis, perceptually uniform and readable in grey and by
// colour-blind readers, so equal steps in weight look like equal steps in colour.
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

}  // namespace attn::viz
