// The lesson's one picture: a query's context vector C = sum_i alpha_i v_i as a blend of the
// value vectors. Each input's value vector is a row of cells coloured by value (one
// diverging scale for every cell, white at 0), its weight alpha_i beside it as a bar, then
// the scaled row alpha_i v_i, and under the scaled rows their sum C. Long inputs keep their
// `top` largest weights in full and sum the rest into one row, so the picture still adds up
// to C. SVG, PNG, and an HTML page that steps through several blends.
#pragma once

#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::viz {

// One row of the picture: a single input, or the rest summed.
struct BlendRow {
  std::string label;           // "position token", or "rest: N inputs"
  Index count = 1;             // inputs in this row; more than 1 for the rest
  double weight = 0.0;         // alpha_i, or the rest's total weight
  std::vector<double> value;   // [Dv] v_i, or the rest's weight-averaged value
  std::vector<double> scaled;  // [Dv] alpha_i v_i, or the rest's sum of them
};

struct Blend {
  std::string title;
  std::vector<BlendRow> rows;   // the top inputs in input order, then the rest when any
  std::vector<double> context;  // [Dv] C as attn::context computes it
};

// The option names that messages use: the library's parameter names, or a command's.
struct BlendArgumentNames {
  const char* weights = "weights";
  const char* value = "value";
  const char* batch = "batch";
  const char* head = "head";
  const char* row = "row";
  const char* tokens = "tokens";
  const char* top = "top";
};

struct BlendOptions {
  Index batch = 0, head = 0;
  Index row = 0;                    // the query whose context is drawn
  std::vector<std::string> tokens;  // empty, or one per input (Lk)
  Index top = 10;                   // inputs drawn in full, by weight; the rest are summed
  std::string title;                // empty: one naming the query
  BlendArgumentNames names;
};

// weights: [B, H, Lq, Lk]  value: [B, Hkv, Lk, Dv] with H a multiple of Hkv (head h reads
// value head h / (H / Hkv)) -> the blend of query `row` of head `head`. Throws attn::Error
// naming the argument (see names) for out-of-range indices, shapes that disagree, a wrong
// number of tokens, non-finite numbers, or a weights row with a negative weight or that
// does not sum to 1.
Blend make_blend(const TensorView& weights, const TensorView& value, const BlendOptions& options);

// The picture as a standalone SVG document; every cell a <rect> with class value, weight,
// scaled or context, data-row, data-col and data-value (the exact number), so that a reader
// or a test can map the picture back to its numbers.
std::string blend_svg(const Blend& blend);

// The same picture as the bytes of an 8-bit RGB PNG file.
std::string blend_png(const Blend& blend);

// The <svg> element of blend_svg without the XML declaration, to place inside HTML.
std::string blend_svg_element(const Blend& blend);

}  // namespace attn::viz
