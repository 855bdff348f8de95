#include "translate_demo.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "attn/error.hpp"
#include "viz/blend_steps.hpp"
#include "viz/draw.hpp"

namespace attn::tools {
namespace {

constexpr std::size_t kBatch = 64;

std::string percent(double share) {
  char text[16];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * share);
  return text;
}

std::vector<std::vector<std::string>> sides(const std::vector<SentencePair>& pairs, bool source) {
  std::vector<std::vector<std::string>> out;
  for (const SentencePair& pair : pairs) out.push_back(source ? pair.source : pair.target);
  return out;
}

// The weight of source word j in output step t, averaged over the heads.
double mean_weight(const Tensor& weights, Index t, Index j) {
  const Index heads = weights.shape()[1], steps = weights.shape()[2], length = weights.shape()[3];
  double sum = 0.0;
  for (Index h = 0; h < heads; ++h) sum += weights.data_as<float>()[(h * steps + t) * length + j];
  return sum / static_cast<double>(heads);
}

// The words with a space between each two.
std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : " ") + word;
  return text;
}

std::vector<std::string> words_of(const Vocabulary& vocabulary, const std::vector<int>& ids) {
  std::vector<std::string> words;
  for (const int id : ids) words.push_back(vocabulary.word(id));
  return words;
}

// Each output word with the two input words it weighs most.
void print_translation(std::ostream& out, const SentencePair& pair, const Vocabulary& target,
                       const Translation& translation) {
  out << '\n' << joined(pair.source) << '\n';
  const auto length = static_cast<Index>(pair.source.size());
  for (std::size_t t = 0; t < translation.words.size(); ++t) {
    std::vector<Index> order(static_cast<std::size_t>(length));
    std::iota(order.begin(), order.end(), Index{0});
    const auto weight = [&](Index j) {
      return mean_weight(translation.cross_weights, static_cast<Index>(t), j);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](Index a, Index b) { return weight(a) > weight(b); });
    char text[160];
    std::snprintf(text, sizeof text, "  %-12s <- %s %.2f",
                  target.word(translation.words[t]).c_str(),
                  pair.source[static_cast<std::size_t>(order[0])].c_str(), weight(order[0]));
    out << text;
    if (length > 1) {
      std::snprintf(text, sizeof text, ", %s %.2f",
                    pair.source[static_cast<std::size_t>(order[1])].c_str(), weight(order[1]));
      out << text;
    }
    out << '\n';
  }
}

// alignment<n>.html (every head), alignment<n>.svg (the head, or the heads' mean) and
// alignment<n>-steps.html (each step's blend of the encoder's values).
void draw_translation(const std::string& folder, std::size_t n, const SentencePair& pair,
                      const Vocabulary& target, const Translation& translation) {
  const Tensor& weights = translation.cross_weights;
  const Index heads = weights.shape()[1], steps = weights.shape()[2], length = weights.shape()[3];
  // Several heads: their mean follows them as one more head, the one the .svg shows.
  const Index drawn_heads = heads == 1 ? 1 : heads + 1;
  Tensor drawn(DType::f32, {1, drawn_heads, steps, length});
  float* out = drawn.data_as<float>();
  std::copy_n(weights.data_as<float>(), weights.numel(), out);
  for (Index t = 0; heads > 1 && t < steps; ++t) {
    for (Index j = 0; j < length; ++j) {
      out[(heads * steps + t) * length + j] = static_cast<float>(mean_weight(weights, t, j));
    }
  }
  const std::vector<std::string> produced = words_of(target, translation.words);
  const std::string name =
      (std::filesystem::path(folder) / ("alignment" + std::to_string(n))).string();
  viz::Picture picture;
  picture.tokens = produced;
  picture.key_tokens = pair.source;
  picture.title = heads == 1 ? "cross-attention: output words down, input words across"
                             : "cross-attention: each head, then their mean (last)";
  std::vector<io::StagedFile> staged;  // the three appear together
  staged.push_back(viz::stage(drawn.view(), name + ".html", picture, "--translate-pictures"));
  picture.head = drawn_heads - 1;
  if (heads > 1) picture.title = "cross-attention, mean over heads";
  staged.push_back(viz::stage(drawn.view(), name + ".svg", picture, "--translate-pictures"));
  viz::BlendStepsOptions options;
  options.steps = produced;
  options.inputs = pair.source;
  options.title = "Translating \"" + joined(pair.source) + "\", word by word";
  staged.push_back(viz::stage_bytes(
      viz::blend_steps_html(weights.view(), translation.cross_values.view(), options),
      name + "-steps.html"));
  io::commit_all(staged);
}

}  // namespace

TranslationCorpus make_corpus(std::uint64_t seed, std::size_t train_count,
                              std::size_t held_out_count) {
  const ToyLanguage language(seed);
  ToyRandom rng(seed + 1);
  std::vector<SentencePair> pairs;
  for (std::size_t i = 0; i < train_count + held_out_count; ++i)
    pairs.push_back(language.sentence(rng));
  Vocabulary source(sides(pairs, true)), target(sides(pairs, false));
  std::vector<SentencePair> held_out(pairs.begin() + static_cast<std::ptrdiff_t>(train_count),
                                     pairs.end());
  pairs.resize(train_count);
  return {std::move(pairs), std::move(held_out), std::move(source), std::move(target)};
}

TrainingRun train(Translator& model, const TranslationCorpus& corpus, double max_seconds,
                  Index max_steps, std::uint64_t seed,
                  const std::function<void(const TrainingRun&)>& log) {
  Adam adam(model.parameters(), 3e-3f);
  ToyRandom rng(seed);
  std::vector<std::size_t> order(corpus.train.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  TrainingRun run;
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (run.steps < max_steps && run.seconds < max_seconds) {
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    for (std::size_t first = 0; first + kBatch <= order.size(); first += kBatch) {
      PackedBatch batch;
      for (std::size_t i = first; i < first + kBatch; ++i) {
        const SentencePair& pair = corpus.train[order[i]];
        batch.add(corpus.source.encode(pair.source), corpus.target.encode(pair.target));
      }
      run.last_loss = model.loss_and_gradients(batch);
      adam.step();
      ++run.steps;
      run.seconds = elapsed();
      if (run.steps % 100 == 0) log(run);
      if (run.steps >= max_steps || run.seconds >= max_seconds) break;
    }
  }
  return run;
}

TranslationScores evaluate(const Translator& model, const TranslationCorpus& corpus) {
  std::size_t total = 0, right = 0, whole = 0, aligned = 0;
  for (const SentencePair& pair : corpus.held_out) {
    const Translation translation = model.translate(corpus.source.encode(pair.source),
                                                    static_cast<Index>(pair.target.size()) + 2);
    const std::vector<std::string> words = words_of(corpus.target, translation.words);
    total += pair.target.size();
    whole += words == pair.target;
    for (std::size_t t = 0; t < pair.target.size() && t < words.size(); ++t) {
      if (words[t] != pair.target[t]) continue;
      ++right;
      double weight = 0.0;
      for (const int j : pair.translates[t]) {
        weight += mean_weight(translation.cross_weights, static_cast<Index>(t), j);
      }
      aligned += weight >= 0.5;
    }
  }
  return {static_cast<double>(right) / static_cast<double>(std::max<std::size_t>(total, 1)),
          static_cast<double>(whole) /
              static_cast<double>(std::max<std::size_t>(corpus.held_out.size(), 1)),
          static_cast<double>(aligned) / static_cast<double>(std::max<std::size_t>(right, 1))};
}

void run_translate_demo(const TranslateDemoArgs& args, std::ostream& out) {
  if (!args.pictures.empty()) {
    std::error_code error;
    std::filesystem::create_directories(args.pictures, error);
    if (error || !std::filesystem::is_directory(args.pictures)) {
      throw Error("--translate-pictures: cannot make the folder '" + args.pictures + "'");
    }
  }
  const TranslationCorpus corpus = make_corpus(args.seed, args.sentences, 200);
  out << "Translation, learned: a toy English -> French-like corpus with "
      << corpus.source.size() - 3 << " source and " << corpus.target.size() - 3 << " target words; "
      << corpus.train.size() << " training sentences, " << corpus.held_out.size()
      << " held out\n\n";
  const TranslatorShape shape;
  Translator model(corpus.source.size(), corpus.target.size(), shape, args.seed);
  const TrainingRun run =
      train(model, corpus, args.seconds, args.steps, args.seed, [&](const TrainingRun& r) {
        char line[96];
        std::snprintf(line, sizeof line, "step %lld: loss %.3f (%.1f s)\n",
                      static_cast<long long>(r.steps), r.last_loss, r.seconds);
        out << line << std::flush;
      });
  char line[200];
  std::snprintf(line, sizeof line, "trained %lld steps in %.1f s\n",
                static_cast<long long>(run.steps), run.seconds);
  out << line;
  const TranslationScores scores = evaluate(model, corpus);
  out << "held out: " << percent(scores.words) << " of words right, " << percent(scores.sentences)
      << " of sentences; of the right words, " << percent(scores.aligned)
      << " put at least half their cross-attention on the source words they translate\n";
  for (std::size_t n = 0; n < 3 && n < corpus.held_out.size(); ++n) {
    const SentencePair& pair = corpus.held_out[n];
    const Translation translation =
        model.translate(corpus.source.encode(pair.source), shape.max_length);
    print_translation(out, pair, corpus.target, translation);
    if (args.pictures.empty() || translation.words.empty()) continue;
    draw_translation(args.pictures, n, pair, corpus.target, translation);
    out << "  drew alignment" << n << ".html, alignment" << n << ".svg and alignment" << n
        << "-steps.html in " << args.pictures << '\n';
  }
}

}  // namespace attn::tools
