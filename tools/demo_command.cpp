// `attn demo`: the lesson's process, step by step, on a real sentence, then the same
// computation at a realistic size, generation token by token, and a translation's
// alignment. It writes nothing unless asked: --weights-out saves part 1's weights,
// --heatmap draws them, --blend draws step 3's blends, --generation pages through part 3
// and --alignment draws part 4.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "alignment_example.hpp"
#include "attn/attn.hpp"
#include "command.hpp"
#include "compute_options.hpp"
#include "generation_trace.hpp"
#include "io/npy.hpp"
#include "table.hpp"
#include "translate_demo.hpp"
#include "viz/draw.hpp"

namespace attn::tools {
namespace {

struct DemoArgs {
  Index heads = 8;
  Index tokens = 1024;
  Index dim = 64;
  unsigned seed = 42;
  ComputeOptions compute;
  std::string weights_out;  // empty: write nothing
  std::string heatmap;      // empty: draw nothing
  std::string blend;        // empty: draw nothing
  Index blend_query = 1;    // the query of a .svg or .png blend
  std::string generation;   // empty: draw nothing
  std::string alignment;    // empty: draw nothing
  bool translate = false;   // the learned translator instead of parts 1-4
  TranslateDemoArgs translator;
};

// Hand-made 4-d embeddings: each coordinate says how much a word is an article, an animal,
// an action or a place. Both "the" are the same vector, so they attend identically: nothing
// here encodes position.
const std::vector<std::string> kTokens = {"the", "cat", "sat", "on", "the", "mat"};
const std::vector<std::string> kFeatures = {"article", "animal", "action", "place"};
const std::vector<double> kEmbeddings = {
    2.0, 0.0, 0.0, 0.4,  // the
    0.2, 2.0, 0.6, 0.0,  // cat
    0.0, 0.8, 2.0, 0.2,  // sat
    0.6, 0.0, 0.4, 1.6,  // on
    2.0, 0.0, 0.0, 0.4,  // the
    0.2, 0.4, 0.0, 2.0,  // mat
};

// t: a float64 tensor -> its elements in order.
std::vector<double> elements(const Tensor& t) {
  const double* data = t.data_as<double>();
  return {data, data + t.numel()};
}

// Part 1: self-attention over the sentence; every word is the query in turn and the
// embeddings are both the keys and the values. Returns the weight matrix [n, n].
Tensor show_lesson(std::ostream& out) {
  const auto n = static_cast<Index>(kTokens.size());
  const auto d = static_cast<Index>(kFeatures.size());
  const TensorView x(kEmbeddings.data(), DType::f64, {1, 1, n, d});
  const Tensor s = scores(x, x);
  Tensor alpha = softmax(s.view());
  const Tensor c = context(alpha.view(), x);

  out << "Part 1. The three steps of attention on \"the cat sat on the mat\"\n\n"
      << "Each word is a 4-d embedding. Every word in turn is the query; the keys and the\n"
      << "values are the embeddings themselves (self-attention).\n\n";
  print_table(out, kTokens, kFeatures, kEmbeddings, 2);

  out << "\nStep 1. Scores: s_ij = (q_i . k_j) / sqrt(" << d << "), query i (row) against key j\n";
  print_table(out, kTokens, kTokens, elements(s));

  out << "\nStep 2. Weights: alpha_ij = exp(s_ij) / sum_j exp(s_ij); each row sums to 1\n";
  std::vector<std::string> weight_columns = kTokens;
  weight_columns.push_back("row sum");
  const std::vector<double> a = elements(alpha);
  std::vector<double> with_sums;
  for (Index i = 0; i < n; ++i) {
    double sum = 0.0;
    for (Index j = 0; j < n; ++j) {
      with_sums.push_back(a[i * n + j]);
      sum += a[i * n + j];
    }
    with_sums.push_back(sum);
  }
  print_table(out, kTokens, weight_columns, with_sums);

  out << "\nStep 3. Context: C_i = sum_j alpha_ij v_j, a weighted mix of the embeddings\n";
  print_table(out, kTokens, kFeatures, elements(c));

  const Result fused = forward(x, x, x);
  double max_difference = 0.0;
  const std::vector<double> steps = elements(c), one_call = elements(fused.context);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    max_difference = std::max(max_difference, std::abs(steps[i] - one_call[i]));
  }
  // Both paths accumulate in float64; anything beyond rounding is a bug, not bad input.
  if (max_difference > 1e-12) {
    throw std::runtime_error("attn::forward differs from the three steps by " +
                             std::to_string(max_difference));
  }
  char line[128];
  std::snprintf(line, sizeof line, "%.1e", max_difference);
  out << "\nattn::forward, the three steps fused in one call, gives the same context "
      << "(max |difference| " << line << ").\n";
  return alpha;
}

Tensor random_tensor(const Dims& dims, std::mt19937_64& rng) {
  Tensor t(DType::f32, dims);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float* data = t.data_as<float>();
  for (Index i = 0; i < t.numel(); ++i) data[i] = normal(rng);
  return t;
}

// Part 2: causal self-attention at a realistic size, timed, with a checksum so that runs on
// different machines or backends can be compared.
void show_realistic(std::ostream& out, const DemoArgs& args) {
  const Dims dims{1, args.heads, args.tokens, args.dim};
  std::mt19937_64 rng(args.seed);
  const Tensor q = random_tensor(dims, rng), k = random_tensor(dims, rng),
               v = random_tensor(dims, rng);
  Options options;
  options.causal = true;
  apply(args.compute, options);

  const auto start = std::chrono::steady_clock::now();
  const Result result = forward(q.view(), k.view(), v.view(), options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  double checksum = 0.0;
  const float* c = result.context.data_as<float>();
  for (Index i = 0; i < result.context.numel(); ++i) checksum += c[i];
  // 4 L^2 D flops per head (two matrix products), halved because causal hides half the keys.
  const double flops = 2.0 * static_cast<double>(args.heads) * static_cast<double>(args.tokens) *
                       static_cast<double>(args.tokens) * static_cast<double>(args.dim);

  char timing[160], sum[64];
  std::snprintf(timing, sizeof timing, "%.1f ms (%.2f GFLOP/s, backend %s)", seconds * 1e3,
                flops / seconds * 1e-9, args.compute.backend.c_str());
  std::snprintf(sum, sizeof sum, "%.6f", checksum);
  out << "\nPart 2. The same at a realistic size: causal self-attention, random float32 inputs "
      << "(seed " << args.seed << ")\n\n"
      << "  q, k, v    " << format_dims(dims) << "  [batch, heads, tokens, dim]\n"
      << "  context    " << format_dims(result.context.shape()) << '\n'
      << "  time       " << timing << '\n'
      << "  checksum   " << sum << "  (sum of the context)\n";
}

// Step 3's context vectors as blends of the embeddings: every query on an HTML page, or
// query `args.blend_query` as an SVG or PNG.
void draw_blends(const DemoArgs& args, const Tensor& alpha) {
  const auto n = static_cast<Index>(kTokens.size());
  const TensorView x(kEmbeddings.data(), DType::f64,
                     {1, 1, n, static_cast<Index>(kFeatures.size())});
  const viz::Format format = viz::format_of(args.blend, "--blend");
  std::vector<viz::Blend> blends;
  for (Index row = 0; row < n; ++row) {
    if (format != viz::Format::html && row != args.blend_query) continue;
    viz::BlendOptions options;
    options.row = row;
    options.tokens = kTokens;
    options.title = "Query " + std::to_string(row) + " \"" +
                    kTokens[static_cast<std::size_t>(row)] +
                    "\": C = sum_i alpha_i v_i, a blend of the embeddings";
    blends.push_back(viz::make_blend(alpha.view(), x, options));
  }
  const std::string bytes =
      format == viz::Format::html
          ? viz::blends_page_html(blends, "Part 1, step 3: each word's context as a blend")
          : viz::render(blends.front(), format);
  viz::stage_bytes(bytes, args.blend).commit();
  std::cout << "\nStep 3's context vectors, drawn as blends of the embeddings: " << args.blend
            << '\n';
}

void run_demo(const DemoArgs& args) {
  if (args.translate) {
    run_translate_demo(args.translator, std::cout);
    return;
  }
  // Bad file names fail before any output.
  if (!args.heatmap.empty()) viz::format_of(args.heatmap, "--heatmap");
  if (!args.blend.empty()) viz::format_of(args.blend, "--blend");
  if (!args.generation.empty() &&
      viz::format_of(args.generation, "--generation") != viz::Format::html) {
    throw Error("--generation: expected a file name ending in .html, given '" + args.generation +
                "'");
  }
  if (!args.alignment.empty()) viz::format_of(args.alignment, "--alignment");
  const Tensor alpha = show_lesson(std::cout);
  if (!args.heatmap.empty()) {
    viz::Picture picture;
    picture.tokens = kTokens;
    picture.title = "Part 1: weights of \"the cat sat on the mat\"";
    viz::draw(alpha.view(), args.heatmap, picture, "--heatmap");
    std::cout << "\nStep 2's weights, drawn as a heatmap (query rows, key columns): "
              << args.heatmap << '\n';
  }
  if (!args.blend.empty()) draw_blends(args, alpha);
  show_realistic(std::cout, args);
  const GenerationTrace trace =
      trace_generation(kTokens, kEmbeddings, static_cast<Index>(kFeatures.size()));
  print_generation(std::cout, trace);
  if (!args.generation.empty()) {
    viz::stage_bytes(generation_page_html(trace), args.generation).commit();
    std::cout << "\nThe decode, step by step, with the cache's blocks and each step's blend: "
              << args.generation << '\n';
  }
  const AlignmentExample example = alignment_example();
  print_alignment(std::cout, example);
  if (!args.alignment.empty()) {
    viz::Picture picture;
    picture.tokens = example.target;
    picture.key_tokens = example.source;
    picture.title = "Part 4: alignment of \"le chat noir dort\" with \"the black cat is sleeping\"";
    viz::draw(example.weights.view(), args.alignment, picture, "--alignment");
    std::cout << "\nThe alignment matrix (output words down, input words across): "
              << args.alignment << '\n';
  }
  if (!args.weights_out.empty()) {
    const auto n = static_cast<Index>(kTokens.size());
    io::write_npy(args.weights_out, alpha.view(), {n, n});
    std::cout << "\nWrote the weights of part 1 ([" << n << ", " << n << "] float64) to "
              << args.weights_out << '\n';
  }
}

}  // namespace

Command add_demo_command(CLI::App& parent) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* app = parent.add_subcommand(
      "demo", "Attention step by step, at a realistic size, then generation token by token");
  app->footer(
      "Part 1 shows the scores, the weights (each row sums to 1) and the context vectors of "
      "self-attention over a six-word sentence. Part 2 runs causal self-attention on random "
      "inputs of the given size and prints the time and a checksum. Part 3 decodes the sentence "
      "one token at a time from a paged KV cache and prints which earlier token each step "
      "attends to most. Part 4 translates a sentence by cross-attention and prints which input "
      "words each output word attends to. Writes nothing unless --weights-out, --heatmap, "
      "--blend, --generation or --alignment is given. --translate learns the translation "
      "instead: every attention of the model, forward and backward, runs through attn.");
  app->option_defaults()->always_capture_default();
  app->add_option("--heads", args->heads, "Part 2: attention heads")->check(CLI::Range(1, 1024));
  app->add_option("--tokens", args->tokens, "Part 2: sequence length")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--dim", args->dim, "Part 2: head dim")->check(CLI::Range(1, 4096));
  app->add_option("--seed", args->seed, "Part 2: seed of the random inputs");
  add_compute_options(*app, args->compute, "Part 2: ");
  app->add_option("--weights-out", args->weights_out,
                  "Write part 1's weight matrix [6, 6] as a float64 .npy [default: nothing]")
      ->type_name("W.npy");
  app->add_option("--heatmap", args->heatmap,
                  "Draw part 1's weights with the words on both axes: a heatmap (.svg, .png) "
                  "or a page with the head view (.html) [default: nothing]")
      ->type_name("FILE");
  app->add_option("--blend", args->blend,
                  "Draw step 3's context vectors as blends of the embeddings: a page stepping "
                  "through every query (.html), or query --blend-query (.svg, .png) "
                  "[default: nothing]")
      ->type_name("FILE");
  app->add_option("--blend-query", args->blend_query,
                  "The query of a .svg or .png --blend, 0 .. 5 (1 is \"cat\")")
      ->check(CLI::Range(0, 5))
      ->type_name("Q");
  app->add_option("--generation", args->generation,
                  "Write part 3 as a page (.html) that steps through the decode: the cache's "
                  "blocks, each step's weights and its blend [default: nothing]")
      ->type_name("FILE.html");
  app->add_option("--alignment", args->alignment,
                  "Draw part 4's alignment matrix, output words down and input words across "
                  "(.svg, .png, .html) [default: nothing]")
      ->type_name("FILE");
  app->add_flag("--translate", args->translate,
                "Instead of parts 1-4: train a small Transformer encoder-decoder on a toy "
                "English -> French-like corpus (about a minute), then translate held-out "
                "sentences, printing each output word's strongest input words");
  app->add_option("--translate-seconds", args->translator.seconds,
                  "--translate: training time limit")
      ->check(CLI::PositiveNumber);
  app->add_option("--translate-steps", args->translator.steps, "--translate: training step limit")
      ->check(CLI::Range(Index{1}, Index{1} << 30));
  app->add_option("--translate-seed", args->translator.seed,
                  "--translate: seed of the corpus, the model and the batches");
  app->add_option("--translate-pictures", args->translator.pictures,
                  "--translate: a folder for the cross-attention of three held-out sentences "
                  "(alignment<n>.html, .svg) and pages stepping through them "
                  "(alignment<n>-steps.html) [default: nothing]")
      ->type_name("FOLDER");
  return {app, [args] { run_demo(*args); }};
}

}  // namespace attn::tools
