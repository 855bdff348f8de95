// `attn demo --translate`: the lesson's translation example, learned. A toy corpus is made
// (toy_language.hpp), a small encoder-decoder (translator.hpp) trains on it with attn's
// forward and backward, then translates held-out sentences greedily, printing each output
// word with the input words its cross-attention weighs most, and optionally drawing the
// alignments and a page stepping through each translation.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "toy_language.hpp"
#include "translator.hpp"

namespace attn::tools {

struct TranslationCorpus {
  std::vector<SentencePair> train, held_out;
  Vocabulary source, target;
};

TranslationCorpus make_corpus(std::uint64_t seed, std::size_t train_count,
                              std::size_t held_out_count);

struct TrainingRun {
  Index steps = 0;
  double seconds = 0.0;
  double last_loss = 0.0;
};

// Adam (learning rate 3e-3) over batches of 64 sentences in an order drawn from `seed`,
// until `max_steps` steps or `max_seconds` have passed; `log` hears every 100th step.
TrainingRun train(Translator& model, const TranslationCorpus& corpus, double max_seconds,
                  Index max_steps, std::uint64_t seed,
                  const std::function<void(const TrainingRun&)>& log);

struct TranslationScores {
  double words = 0.0;      // target words right, in place
  double sentences = 0.0;  // sentences right whole
  // Of the right words: the share whose cross-attention, averaged over heads, puts at least
  // half its weight on the source words they translate (the generator's alignment).
  double aligned = 0.0;
};

TranslationScores evaluate(const Translator& model, const TranslationCorpus& corpus);

struct TranslateDemoArgs {
  double seconds = 55.0;
  Index steps = 3000;
  std::size_t sentences = 6000;
  std::uint64_t seed = 0;
  std::string pictures;  // a folder; empty: draw nothing
};

void run_translate_demo(const TranslateDemoArgs& args, std::ostream& out);

}  // namespace attn::tools
