#include "viz/blend_steps.hpp"

#include <string>
#include <vector>

#include "attn/error.hpp"
#include "viz/blend.hpp"
#include "viz/steps_page.hpp"
#include "viz/tokens.hpp"

namespace attn::viz {

std::string blend_steps_html(const TensorView& weights, const TensorView& value,
                             const BlendStepsOptions& options) {
  if (weights.shape[0] != 1) {
    throw Error("weights: expected one batch entry [1, H, steps, Lk], given " +
                format_dims(weights.shape));
  }
  const Index heads = weights.shape[1], rows = weights.shape[2];
  if (rows < 1)
    throw Error("weights: expected at least one step, given " + format_dims(weights.shape));
  check_label_count(options.steps, rows, "steps", "query row");
  std::vector<PageStep> steps;
  for (Index r = 0; r < rows; ++r) {
    const std::string word =
        options.steps.empty() ? std::to_string(r) : options.steps[static_cast<std::size_t>(r)];
    std::string markup;
    for (Index h = 0; h < heads; ++h) {
      BlendOptions blend;
      blend.head = h;
      blend.row = r;
      blend.tokens = options.inputs;
      blend.top = options.top;
      blend.names.tokens = "inputs";
      blend.title = "step " + std::to_string(r) + " (\"" + word + "\"), head " + std::to_string(h) +
                    ": C = sum_i alpha_i v_i";
      markup += blend_svg_element(make_blend(weights, value, blend));
    }
    steps.push_back({"step " + std::to_string(r) + ": \"" + word + "\"", markup});
  }
  return steps_page_html(
      options.title.empty() ? "Generation, step by step" : options.title,
      "Each step is one output word: every head's weights over the inputs (the bars), the "
      "inputs' value vectors scaled by them, and their sum, the context vector C that the "
      "step's next layers read. Use the slider, the buttons or the arrow keys to step.",
      steps);
}

}  // namespace attn::viz
