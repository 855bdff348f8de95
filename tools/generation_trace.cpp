#include "generation_trace.hpp"

#include <cmath>
#include <cstdio>

#include "attn/attn.hpp"
#include "viz/blend.hpp"
#include "viz/cache_blocks.hpp"
#include "viz/steps_page.hpp"

namespace attn::tools {
namespace {

constexpr Index kPageSize = 2;

// What each feature's query looks for: an article looks for an animal, an animal for an
// action, an action for a place, a place for an article. Without it every token would
// mostly attend to itself (its query equals its key).
std::vector<double> query_of(const double* x, Index dim) {
  std::vector<double> q(static_cast<std::size_t>(dim), 0.0);
  for (Index f = 0; f < dim; ++f) q[static_cast<std::size_t>((f + 1) % dim)] = x[f];
  return q;
}

}  // namespace

GenerationTrace trace_generation(const std::vector<std::string>& tokens,
                                 const std::vector<double>& embeddings, Index dim) {
  KVCache cache({.heads_kv = 1,
                 .dim = dim,
                 .dim_v = dim,
                 .page_size = kPageSize,
                 .dtype = CacheDType::f32,
                 .max_blocks = 0});
  const KVCache::SequenceId seq = cache.add_sequence();
  GenerationTrace trace{tokens, kPageSize, {}};
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const double* x = embeddings.data() + static_cast<Index>(t) * dim;
    const TensorView row(x, DType::f64, {1, 1, 1, dim});
    cache.append(seq, row, row);
    const std::vector<double> q = query_of(x, dim);
    const Decoded step = decode(TensorView(q.data(), DType::f64, {1, 1, 1, dim}), cache, {seq});
    // Weights from the decode's lse: alpha_j = exp(s_j - lse); they sum to 1.
    const Tensor keys = cache.keys(seq);
    const double lse = step.lse.data_as<float>()[0];
    GenerationStep traced{{}, cache.values(seq), cache.block_table(seq)};
    for (std::size_t j = 0; j <= t; ++j) {
      double s = 0.0;
      for (Index d = 0; d < dim; ++d) {
        s +=
            q[static_cast<std::size_t>(d)] * keys.data_as<float>()[static_cast<Index>(j) * dim + d];
      }
      traced.weights.push_back(std::exp(s / std::sqrt(static_cast<double>(dim)) - lse));
    }
    trace.steps.push_back(std::move(traced));
  }
  return trace;
}

void print_generation(std::ostream& out, const GenerationTrace& trace) {
  out << "\nPart 3. Generation, one token at a time\n\n"
      << "Each step appends the new token's embedding to a paged KV cache (blocks of "
      << trace.page_size << "\ntokens) and decodes its query against every token so far. A "
      << "query looks for the\nnext feature (article -> animal -> action -> place -> article).\n\n"
      << "  step  token largest earlier token  weight   itself   cache tokens in blocks\n";
  for (std::size_t t = 0; t < trace.steps.size(); ++t) {
    const std::vector<double>& weights = trace.steps[t].weights;
    std::size_t best = t;
    for (std::size_t j = 0; j < t; ++j) {
      if (best == t || weights[j] > weights[best]) best = j;
    }
    const char* token = trace.tokens[t].c_str();
    char line[160];
    if (t == 0) {
      std::snprintf(line, sizeof line, "  %4zu  %-5s %-18s %6s %8.3f", t, token, "-", "-",
                    weights[t]);
    } else {
      std::snprintf(line, sizeof line, "  %4zu  %-5s %-4s (position %zu)    %6.3f %8.3f", t, token,
                    trace.tokens[best].c_str(), best, weights[best], weights[t]);
    }
    out << line << "   " << t + 1 << " in " << trace.steps[t].block_table.size() << '\n';
  }
}

std::string generation_page_html(const GenerationTrace& trace) {
  std::vector<viz::PageStep> steps;
  for (std::size_t t = 0; t < trace.steps.size(); ++t) {
    const GenerationStep& step = trace.steps[t];
    const auto seen = static_cast<Index>(t + 1);
    const std::vector<std::string> seen_tokens(trace.tokens.begin(),
                                               trace.tokens.begin() + static_cast<long>(seen));
    viz::BlendOptions options;
    options.tokens = seen_tokens;
    options.title = "Step " + std::to_string(t) + ", \"" + trace.tokens[t] +
                    "\": its context C = sum_i alpha_i v_i over the cached tokens";
    const viz::Blend blend = viz::make_blend(
        TensorView(step.weights.data(), DType::f64, {1, 1, 1, seen}), step.values.view(), options);
    const std::string cache = viz::cache_blocks_svg_element({.page_size = trace.page_size,
                                                             .block_table = step.block_table,
                                                             .tokens = seen_tokens,
                                                             .weights = step.weights});
    steps.push_back({"step " + std::to_string(t) + ": \"" + trace.tokens[t] + "\"",
                     cache + viz::blend_svg_element(blend)});
  }
  return viz::steps_page_html(
      "Generation, one token at a time",
      "Each step appends the new token's key and value to a paged KV cache (blocks of " +
          std::to_string(trace.page_size) +
          " tokens; a new block is taken when the last one is full) and decodes the token's "
          "query against every cached token. The blocks show the weight alpha_i on each cached "
          "token; below, the values blend into the step's context. Use the slider, the "
          "buttons or the arrow keys to step.",
      steps);
}

}  // namespace attn::tools
