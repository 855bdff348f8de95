// The translation demo's model: a Transformer encoder-decoder (one encoder block, one
// decoder block, pre-norm) whose every attention goes through attn, forward and backward:
// the encoder's self-attention (each word sees the words after it), the decoder's causal
// self-attention and its cross-attention (one head). A batch is packed without padding (attn's
// cu_seqlens), so no mask is needed. Greedy translation keeps the decoder's keys and values in an
// attn::KVCache and reads them with attn::decode. examples/translate.py is the same model in
// PyTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attn/tensor.hpp"
#include "translator_layers.hpp"

namespace attn::tools {

struct TranslatorShape {
  Index dim = 64;
  Index heads = 2;        // self-attention, encoder and decoder
  Index cross_heads = 1;  // its weights are the alignment: two split each noun phrase
  Index max_length = 16;  // positions, either side
};

// Sentence pairs packed one after another; offsets are attn's cu_seqlens.
struct PackedBatch {
  std::vector<int> source, target_in, target_out;  // target_in: <s> + target; out: target + </s>
  std::vector<int> source_positions, target_positions;
  std::vector<std::int64_t> source_offsets{0}, target_offsets{0};
  void add(const std::vector<int>& source_ids, const std::vector<int>& target_ids);
};

struct Translation {
  std::vector<int> words;  // without </s>
  Tensor cross_weights;    // [1, cross_heads, words, source length] float32
  Tensor cross_values;     // [1, cross_heads, source length, dim / cross_heads] float32
};

class Translator {
 public:
  Translator(int source_words, int target_words, const TranslatorShape& shape, std::uint64_t seed);
  ~Translator();
  Translator(const Translator&) = delete;
  Translator& operator=(const Translator&) = delete;

  // The mean cross-entropy of the batch's target words, adding its gradient into every
  // parameter's grad.
  double loss_and_gradients(const PackedBatch& batch);
  std::vector<Parameter*> parameters();
  // Greedy: at most `limit` words, stopping at </s>.
  Translation translate(const std::vector<int>& source, Index limit) const;

 private:
  struct Model;
  std::unique_ptr<Model> model_;
};

}  // namespace attn::tools
