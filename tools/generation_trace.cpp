#include "generation_trace.hpp"

#include <cmath>
#include <cstdio>

#include "attn/attn.hpp"

namespace attn::tools {
namespace {

// What each feature's query looks for: an article looks for an animal, an animal for an
// action, an action for a place, a place for an article. Without it every token would
// mostly attend to itself (its query equals its key).
std::vector<double> query_of(const double* x, Index dim) {
  std::vector<double> q(static_cast<std::size_t>(dim), 0.0);
  for (Index f = 0; f < dim; ++f) q[static_cast<std::size_t>((f + 1) % dim)] = x[f];
  return q;
}

}  // namespace

void show_generation(std::ostream& out, const std::vector<std::string>& tokens,
                     const std::vector<double>& embeddings, Index dim) {
  KVCache cache({.heads_kv = 1,
                 .dim = dim,
                 .dim_v = dim,
                 .page_size = 2,
                 .dtype = CacheDType::f32,
                 .max_blocks = 0});
  const KVCache::SequenceId seq = cache.add_sequence();
  out << "\nPart 3. Generation, one token at a time\n\n"
      << "Each step appends the new token's embedding to a paged KV cache (blocks of 2\n"
      << "tokens) and decodes its query against every token so far. A query looks for the\n"
      << "next feature (article -> animal -> action -> place -> article).\n\n"
      << "  step  token largest earlier token  weight   itself   cache tokens in blocks\n";
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const double* x = embeddings.data() + static_cast<Index>(t) * dim;
    const TensorView row(x, DType::f64, {1, 1, 1, dim});
    cache.append(seq, row, row);
    const std::vector<double> q = query_of(x, dim);
    const Decoded step = decode(TensorView(q.data(), DType::f64, {1, 1, 1, dim}), cache, {seq});
    // Weights from the decode's lse: alpha_j = exp(s_j - lse); they sum to 1.
    const Tensor keys = cache.keys(seq);
    const double lse = step.lse.data_as<float>()[0];
    std::size_t best = t;
    double best_weight = -1.0, self_weight = 0.0;
    for (std::size_t j = 0; j <= t; ++j) {
      double s = 0.0;
      for (Index d = 0; d < dim; ++d) {
        s +=
            q[static_cast<std::size_t>(d)] * keys.data_as<float>()[static_cast<Index>(j) * dim + d];
      }
      const double weight = std::exp(s / std::sqrt(static_cast<double>(dim)) - lse);
      if (j == t) {
        self_weight = weight;
      } else if (weight > best_weight) {
        best_weight = weight;
        best = j;
      }
    }
    char line[160];
    if (t == 0) {
      std::snprintf(line, sizeof line, "  %4zu  %-5s %-18s %6s %8.3f", t, tokens[t].c_str(), "-",
                    "-", self_weight);
    } else {
      std::snprintf(line, sizeof line, "  %4zu  %-5s %-4s (position %zu)    %6.3f %8.3f", t,
                    tokens[t].c_str(), tokens[best].c_str(), best, best_weight, self_weight);
    }
    out << line << "   " << cache.length(seq) << " in " << cache.block_table(seq).size() << '\n';
  }
}

}  // namespace attn::tools
