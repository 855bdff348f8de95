// A page that steps through generation, one output row a step: at each step every head's
// blend of the value vectors by that row's weights (cpu-free: viz/blend.hpp's pictures on
// viz/steps_page.hpp's page), named by the word the step produced. For a decoder's
// cross-attention over an encoder's outputs, or any attention whose rows are steps.
#pragma once

#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::viz {

struct BlendStepsOptions {
  std::vector<std::string> steps;   // empty, or one name per query row (the word produced)
  std::vector<std::string> inputs;  // empty, or one per key (Lk)
  Index top = 10;                   // inputs drawn in full per blend; the rest summed
  std::string title;                // empty: "Generation, step by step"
};

// weights: [1, H, steps, Lk] (each row sums to 1)  value: [1, Hkv, Lk, Dv], H a multiple of
// Hkv. Throws attn::Error naming weights, value, steps, inputs or top (make_blend's checks).
std::string blend_steps_html(const TensorView& weights, const TensorView& value,
                             const BlendStepsOptions& options);

}  // namespace attn::viz
