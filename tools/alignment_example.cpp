#include "alignment_example.hpp"

#include <cstdio>

#include "attn/attn.hpp"
#include "table.hpp"

namespace attn::tools {
namespace {

// Features: how much a word is an article, a colour, an animal, sleeping, or an auxiliary
// verb. An input word's key is what it means; an output word's query asks for what it
// translates, sharply (x 8), so that softmax puts most of its weight there.
const std::vector<std::string> kSource = {"the", "black", "cat", "is", "sleeping"};
const std::vector<std::string> kTarget = {"le", "chat", "noir", "dort"};
constexpr Index kFeatures = 5;
const std::vector<double> kKeys = {
    1.0, 0.0, 0.0, 0.0, 0.0,  // the
    0.0, 1.0, 0.0, 0.0, 0.0,  // black
    0.0, 0.0, 1.0, 0.0, 0.0,  // cat
    0.0, 0.0, 0.0, 0.5, 1.0,  // is
    0.0, 0.0, 0.0, 1.0, 0.3,  // sleeping
};
const std::vector<double> kQueries = {
    8.0, 0.0, 0.0, 0.0, 0.0,  // le: the
    0.0, 0.0, 8.0, 0.0, 0.0,  // chat: cat
    0.0, 8.0, 0.0, 0.0, 0.0,  // noir: black
    0.0, 0.0, 0.0, 5.6, 3.2,  // dort: is sleeping
};

}  // namespace

AlignmentExample alignment_example() {
  const auto len_q = static_cast<Index>(kTarget.size()), len_k = static_cast<Index>(kSource.size());
  const TensorView q(kQueries.data(), DType::f64, {1, 1, len_q, kFeatures});
  const TensorView k(kKeys.data(), DType::f64, {1, 1, len_k, kFeatures});
  return {kSource, kTarget, weights(q, k).weights};
}

void print_alignment(std::ostream& out, const AlignmentExample& example) {
  const auto len_k = static_cast<Index>(example.source.size());
  const double* w = example.weights.data_as<double>();
  out << "\nPart 4. Alignment: translating \"the black cat is sleeping\" -> \"le chat noir "
         "dort\"\n\n"
      << "Cross-attention: each output word's query scores every input word's key, with no\n"
      << "causal mask (the whole input is known). The output is shorter and swaps adjective\n"
      << "and noun, yet each output word puts most of its weight on the words it translates.\n\n";
  print_table(out, example.target, example.source,
              std::vector<double>(w, w + example.weights.numel()));
  out << '\n';
  for (std::size_t i = 0; i < example.target.size(); ++i) {
    const double* row = w + static_cast<Index>(i) * len_k;
    std::size_t best = 0;
    for (std::size_t j = 1; j < example.source.size(); ++j) {
      if (row[j] > row[best]) best = j;
    }
    char line[96];
    std::snprintf(line, sizeof line, "  %-5s <- %-9s %.3f\n", example.target[i].c_str(),
                  example.source[best].c_str(), row[best]);
    out << line;
  }
}

}  // namespace attn::tools
