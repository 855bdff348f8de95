// Pictures of weights as files: the format follows the file name, and the file appears
// only once it is complete.
#pragma once

#include <string>
#include <vector>

#include "attn/tensor.hpp"
#include "io/staged_file.hpp"
#include "viz/blend.hpp"
#include "viz/downsample.hpp"

namespace attn::viz {

enum class Format : unsigned char { svg, png, html };

// The format named by `path`'s extension (.svg, .png, .html or .htm, any case). Throws
// attn::Error naming `argument` otherwise.
Format format_of(const std::string& path, const char* argument);

struct Picture {
  Index batch = 0;
  Index head = 0;                   // the heatmap's head; the HTML page shows them all
  std::vector<std::string> tokens;  // empty, or Lq or Lk tokens (see token_labels)
  // Cross-attention's input words when they differ from the output words: then `tokens`
  // labels the queries (Lq of them) and these the keys (Lk). Empty: see `tokens`.
  std::vector<std::string> key_tokens;
  std::string title;  // empty: one naming the batch entry and head
  Reduce reduce = Reduce::max;
  Index max_cells = 0;  // cells per side at most; 0: 512 for heatmaps, 128 for the page
};

// weights: [B, H, Lq, Lk] of any float dtype -> the bytes of the picture in `format`.
std::string render(const TensorView& weights, Format format, const Picture& picture);

// render() in the format of `path`, written to a temporary file; commit() on the result
// moves it into place. Throws attn::Error naming `argument` for a bad extension, or the
// path when it cannot be written; no file appears then.
io::StagedFile stage(const TensorView& weights, const std::string& path, const Picture& picture,
                     const char* argument = "out");

// stage, then commit.
void draw(const TensorView& weights, const std::string& path, const Picture& picture,
          const char* argument = "out");

// `bytes` written to a temporary file next to `path`; commit() moves it into place.
io::StagedFile stage_bytes(const std::string& bytes, const std::string& path);

// One blend in `format`; the HTML page holds it as its only step.
std::string render(const Blend& blend, Format format);

// Several blends (one per query, say) as an HTML page that steps through them.
std::string blends_page_html(const std::vector<Blend>& blends, const std::string& title);

}  // namespace attn::viz
