// A self-contained HTML page that steps through pictures: a slider and previous / next
// buttons (or the arrow keys) choose the step, "#step=N" in the address opens step N, and
// pointing at any cell that carries a data-value shows its exact number under the controls.
// The pictures are inline SVG made by C++, so the script only chooses and reads them.
#pragma once

#include <string>
#include <vector>

namespace attn::viz {

struct PageStep {
  std::string name;    // shown beside the controls; plain text
  std::string markup;  // the step's pictures: SVG elements from this library, not user text
};

// Throws attn::Error naming steps when there are none.
std::string steps_page_html(const std::string& title, const std::string& note,
                            const std::vector<PageStep>& steps);

}  // namespace attn::viz
