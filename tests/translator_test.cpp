// `attn demo --translate`'s model (tools/translator.hpp): its gradients against finite
// differences of its loss and its bits across thread counts; the toy language's rules.
// Every attention of the model is attn's forward and backward over packed sentences.
// translator_learning_test.cpp trains it.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "support/threads.hpp"
#include "toy_language.hpp"
#include "translate_demo.hpp"
#include "translator.hpp"

namespace attn::tools {
namespace {

PackedBatch batch_of(const TranslationCorpus& corpus, std::size_t first, std::size_t count) {
  PackedBatch batch;
  for (std::size_t i = first; i < first + count; ++i) {
    const SentencePair& pair = corpus.train[i];
    batch.add(corpus.source.encode(pair.source), corpus.target.encode(pair.target));
  }
  return batch;
}

TEST(ToyLanguage, KeepsItsRules) {
  const ToyLanguage language(5);
  ToyRandom rng(6);
  std::set<std::size_t> lengths;
  for (int n = 0; n < 500; ++n) {
    const SentencePair pair = language.sentence(rng);
    ASSERT_GE(pair.source.size(), 3u);
    ASSERT_LE(pair.source.size(), 12u);
    ASSERT_EQ(pair.target.size(), pair.translates.size());
    lengths.insert(pair.source.size());
    for (const std::vector<int>& sources : pair.translates) {
      ASSERT_TRUE(sources.size() == 1 || (sources.size() == 2 && pair.source[sources[0]] == "is"));
      for (const int a : sources) {
        ASSERT_GE(a, 0);
        ASSERT_LT(a, static_cast<int>(pair.source.size()));
      }
    }
    // An article translates "the" or "a" and agrees with its noun.
    for (std::size_t t = 0; t < pair.target.size(); ++t) {
      const std::string& word = pair.target[t];
      const std::string& source = pair.source[static_cast<std::size_t>(pair.translates[t][0])];
      if (word == "le" || word == "la") {
        EXPECT_EQ(source, "the");
      } else if (word == "un" || word == "une") {
        EXPECT_EQ(source, "a");
      }
    }
  }
  EXPECT_EQ(lengths.size(), 10u);  // every length from 3 to 12
}

// Central differences of the loss against the gradient, a few entries of every parameter.
// An entry whose left and right differences disagree sits by a ReLU's kink, where no
// difference tells the gradient; another entry is drawn then.
TEST(Translator, GradientsMatchFiniteDifferences) {
  const testing::Threads one(1);  // hundreds of tiny products: threads would only wait
  const TranslationCorpus corpus = make_corpus(1, 4, 0);
  const PackedBatch batch = batch_of(corpus, 0, 4);
  Translator model(corpus.source.size(), corpus.target.size(),
                   {.dim = 8, .heads = 2, .cross_heads = 1, .max_length = 16}, 2);
  const double loss = model.loss_and_gradients(batch);
  std::vector<std::vector<float>> gradients;  // before the differences add theirs
  for (const Parameter* p : model.parameters()) gradients.push_back(p->grad.values);
  constexpr float kStep = 1e-2f;
  const auto loss_at = [&](Parameter& p, std::size_t i, float value) {
    const float kept = p.value.values[i];
    p.value.values[i] = value;
    const double at = model.loss_and_gradients(batch);
    p.value.values[i] = kept;
    return at;
  };
  ToyRandom rng(3);
  std::size_t index = 0;
  for (Parameter* p : model.parameters()) {
    const std::vector<float>& gradient = gradients[index];
    double error = 0.0, size = 0.0;
    for (int n = 0; n < 6; ++n) {
      for (int tries = 0;; ++tries) {
        ASSERT_LT(tries, 100) << "no smooth entry with a gradient in parameter " << index;
        const std::size_t i = rng.below(p->value.values.size());
        if (gradient[i] == 0.0f) continue;  // an embedding row the batch does not use
        const float x = p->value.values[i];
        const double right = (loss_at(*p, i, x + kStep) - loss) / kStep,
                     left = (loss - loss_at(*p, i, x - kStep)) / kStep;
        const double central = (right + left) / 2.0;
        if (std::abs(right - left) > 0.05 * std::abs(central) + 5e-5) continue;
        error += (central - gradient[i]) * (central - gradient[i]);
        size += static_cast<double>(gradient[i]) * gradient[i];
        break;
      }
    }
    EXPECT_LE(std::sqrt(error), 3e-2 * std::sqrt(size) + 5e-5) << "parameter " << index;
    ++index;
  }
}

std::vector<float> trained_parameters(int threads) {
  const testing::Threads chosen(threads);
  const TranslationCorpus corpus = make_corpus(4, 256, 0);
  Translator model(corpus.source.size(), corpus.target.size(), {}, 5);
  train(model, corpus, 1e9, 6, 6, [](const TrainingRun&) {});
  std::vector<float> all;
  for (const Parameter* p : model.parameters()) {
    all.insert(all.end(), p->value.values.begin(), p->value.values.end());
  }
  return all;
}

TEST(Translator, TrainsToTheSameBitsOnAnyThreadCount) {
  EXPECT_EQ(trained_parameters(1), trained_parameters(2));
}

}  // namespace
}  // namespace attn::tools
