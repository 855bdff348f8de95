// The demo's translation example: "the black cat is sleeping" -> "le chat noir dort". Each
// output word must put most of its weight on the input words it translates, although the
// sentences differ in length and "chat noir" reverses "black cat".
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "alignment_example.hpp"

namespace attn::tools {
namespace {

struct Translation {
  std::string target;
  std::vector<std::string> sources;  // the input words it translates
};

TEST(Alignment, EachOutputWordAttendsToTheWordsItTranslates) {
  const AlignmentExample example = alignment_example();
  ASSERT_EQ(example.target, (std::vector<std::string>{"le", "chat", "noir", "dort"}));
  ASSERT_EQ(example.source, (std::vector<std::string>{"the", "black", "cat", "is", "sleeping"}));
  ASSERT_EQ(example.weights.shape(), (Dims{1, 1, 4, 5}));
  const std::vector<Translation> translations = {
      {"le", {"the"}}, {"chat", {"cat"}}, {"noir", {"black"}}, {"dort", {"is", "sleeping"}}};
  const double* w = example.weights.data_as<double>();
  for (std::size_t i = 0; i < translations.size(); ++i) {
    SCOPED_TRACE(translations[i].target);
    double on_sources = 0.0, largest_elsewhere = 0.0, row_sum = 0.0;
    for (std::size_t j = 0; j < example.source.size(); ++j) {
      const double weight = w[i * example.source.size() + j];
      row_sum += weight;
      const auto& sources = translations[i].sources;
      if (std::find(sources.begin(), sources.end(), example.source[j]) != sources.end()) {
        on_sources += weight;
        EXPECT_GT(weight, 0.35) << example.source[j];
      } else {
        largest_elsewhere = std::max(largest_elsewhere, weight);
      }
    }
    EXPECT_NEAR(row_sum, 1.0, 1e-12);
    EXPECT_GT(on_sources, 0.85);
    EXPECT_LT(largest_elsewhere, 0.05);
  }
}

TEST(Alignment, PrintsTheMatrixAndEachWordsStrongestSource) {
  std::ostringstream out;
  print_alignment(out, alignment_example());
  const std::string text = out.str();
  for (const char* line : {"le    <- the", "chat  <- cat", "noir  <- black", "dort  <- sleeping",
                           "sleeping", "no\ncausal mask"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace attn::tools
