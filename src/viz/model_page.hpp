// A self-contained HTML page of a whole model's self-attention for one text: a layer x head
// grid of small heatmaps with each layer's mean over heads, one head large with the tokens
// on both axes, and a head view (tokens in two columns, lines from each query to the keys
// it attends to). Controls choose the layer and head, switch between one colour scale for
// the whole model (to compare heads) and a scale per head, and hide special tokens such as
// [CLS] and [SEP] (each shown row is then renormalised over the shown keys, so it still
// sums to 1), and choose what is shown: the weights alpha, each input's contribution
// ||alpha_ij v_j|| where given (attn::contributions), or the attention rollout through the
// layers (attn::rollout, one matrix a layer, computed here from the weights). The controls
// and the colour bar stay at the top of the window.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::viz {

struct ModelPageOptions {
  std::vector<std::string> tokens;  // empty, or one per position (L of them)
  std::vector<bool> special;        // empty, or L flags: the tokens the toggle hides
  std::string title;                // empty: "Attention in every layer"
  // [layers, H, L, L] as the weights, each input's contribution ||alpha_ij v_j||: a mode
  // of the page when given.
  std::optional<TensorView> contributions;
};

// The most weights one page holds, layers x heads x L x L: 2^24, a page of about 90 MB.
inline constexpr Index kMostModelPageWeights = Index{1} << 24;

// weights: [layers, H, L, L], one text's self-attention weights in every layer, any float
// dtype (drawn as float32, exact for float32 weights). Throws attn::Error naming weights,
// contributions, tokens or special.
std::string model_page_html(const TensorView& weights, const ModelPageOptions& options);

}  // namespace attn::viz
