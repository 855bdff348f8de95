// `attn demo --translate`'s model learns: trained for a fixed number of steps from a fixed
// seed (its bits repeat on a CPU), it translates held-out sentences greedily through attn's
// KV cache, most words right, and nearly every right word's cross-attention puts at least
// half its weight on the source words it translates (tools/toy_language.hpp's alignment).
#include <gtest/gtest.h>

#include <cstdio>

#include "support/threads.hpp"
#include "translate_demo.hpp"
#include "translator.hpp"

namespace attn::tools {
namespace {

TEST(Translator, LearnsTheWordsAndTheirAlignment) {
  // One thread: beside another busy test (ctest -j2) every parallel region would wait.
  const testing::Threads one(1);
  const TranslationCorpus corpus = make_corpus(3, 3000, 100);
  Translator model(corpus.source.size(), corpus.target.size(), {}, 3);
  const TrainingRun run = train(model, corpus, 1e9, 800, 3, [](const TrainingRun&) {});
  ASSERT_EQ(run.steps, 800);
  const TranslationScores scores = evaluate(model, corpus);
  EXPECT_GE(scores.words, 0.9);
  EXPECT_GE(scores.aligned, 0.9);
  std::printf("held out: %.1f%% of words right, %.1f%% aligned\n", 100 * scores.words,
              100 * scores.aligned);
  // Every output word came through the KV cache, and its cross-attention sums to 1.
  const Translation translation =
      model.translate(corpus.source.encode(corpus.held_out[0].source), 16);
  ASSERT_GT(translation.words.size(), 0u);
  const auto& shape = translation.cross_weights.shape();
  for (Index t = 0; t < shape[2]; ++t) {
    double sum = 0.0;
    for (Index j = 0; j < shape[3]; ++j)
      sum += translation.cross_weights.data_as<float>()[t * shape[3] + j];
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

}  // namespace
}  // namespace attn::tools
