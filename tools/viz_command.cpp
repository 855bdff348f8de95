// `attn viz`: pictures of attention weights saved by `attn run --weights` (or by any
// program writing .npy): a heatmap of one head (SVG or PNG) or an HTML page of every head;
// with --blend, how one query's weights blend the value vectors into its context.
#include <memory>
#include <string>

#include "attn/attn.hpp"
#include "command.hpp"
#include "io/npy.hpp"
#include "tokens_file.hpp"
#include "viz/draw.hpp"

namespace attn::tools {
namespace {

struct VizArgs {
  std::string weights, tokens, out, title;
  Index head = 0, batch = 0;
  std::string downsample = "max";
  Index max_cells = 0;
  bool blend = false;
  std::string value;
  Index row = 0;
  Index top = viz::BlendOptions{}.top;
};

// `path` read for `option`, which holds a matrix: [A, B, R, C], [B, R, C] or [R, C].
io::NpyArray read_matrices(const std::string& path, const char* option, const char* dims) {
  io::NpyArray array = io::read_npy(path);
  if (array.shape.size() < 2) {
    throw Error(std::string(option) + ": expected 2 to 4 dims " + dims + ", given shape " +
                io::format_shape(array.shape) + " in " + path);
  }
  return array;
}

void run_blend(const VizArgs& args, const io::NpyArray& weights) {
  if (args.value.empty()) throw Error("--value: required with --blend");
  const io::NpyArray value =
      read_matrices(args.value, "--value", "[B, Hkv, Lk, Dv], [Hkv, Lk, Dv] or [Lk, Dv]");
  viz::BlendOptions options;
  options.batch = args.batch;
  options.head = args.head;
  options.row = args.row;
  options.top = args.top;
  options.title = args.title;
  options.names = {.weights = "--weights",
                   .value = "--value",
                   .batch = "--batch",
                   .head = "--head",
                   .row = "--row",
                   .tokens = "--tokens",
                   .top = "--top"};
  if (!args.tokens.empty()) options.tokens = read_tokens(args.tokens, "--tokens");
  const viz::Blend blend = viz::make_blend(weights.tensor.view(), value.tensor.view(), options);
  viz::stage_bytes(viz::render(blend, viz::format_of(args.out, "--out")), args.out).commit();
}

void run_viz(const VizArgs& args) {
  viz::format_of(args.out, "--out");  // a bad name fails before any reading
  const io::NpyArray weights =
      read_matrices(args.weights, "--weights", "[B, H, Lq, Lk], [H, Lq, Lk] or [Lq, Lk]");
  if (weights.tensor.dtype() == DType::boolean) {
    throw Error("--weights: expected float16, float32 or float64, given bool in " + args.weights);
  }
  if (args.blend) return run_blend(args, weights);
  // Checked here too so that messages name the command's options.
  const Dims& dims = weights.tensor.shape();
  check_index("--batch", args.batch, dims[0]);
  check_index("--head", args.head, dims[1]);
  viz::Picture picture;
  picture.batch = args.batch;
  picture.head = args.head;
  picture.tokens = read_tokens(args.tokens, "--tokens", dims[2], dims[3]);
  picture.title = args.title;
  picture.reduce = viz::parse_reduce(args.downsample, "--downsample");
  picture.max_cells = args.max_cells;
  viz::draw(weights.tensor.view(), args.out, picture, "--out");
}

}  // namespace

Command add_viz_command(CLI::App& parent) {
  auto args = std::make_shared<VizArgs>();
  CLI::App* app =
      parent.add_subcommand("viz", "Pictures of attention weights: heatmap (SVG, PNG) or HTML");
  app->footer(
      "Draws weights saved as .npy (e.g. by attn run --weights). FILE.svg and FILE.png get a "
      "heatmap of one head: query rows down, keys across, a colour bar, and token labels when "
      "--tokens is given; matrices larger than --max-cells per side are drawn in blocks. "
      "FILE.html gets a self-contained page with every head of the batch entry and a head view "
      "(point at a query token to see the keys it attends to). With --blend, --value and "
      "--row: query ROW's context C = sum_i alpha_i v_i drawn as a blend of the value vectors "
      "(each v_i, its weight, alpha_i v_i, and their sum C; inputs past --top summed into one "
      "row). The file appears only once complete; on bad input attn prints one line and exits "
      "with status 2.");
  app->option_defaults()->always_capture_default();
  app->add_option("--weights", args->weights,
                  "Weights [B, H, Lq, Lk], [H, Lq, Lk] or [Lq, Lk] (float16/32/64)")
      ->required()
      ->type_name("W.npy");
  app->add_option("--out", args->out, "The picture; the extension picks the format")
      ->required()
      ->type_name("FILE.svg|.png|.html");
  app->add_option("--tokens", args->tokens,
                  "UTF-8 text, one token per line: Lq tokens label the queries, Lk the keys "
                  "(both for self-attention); with --blend, Lk label the inputs [default: indices]")
      ->type_name("TOKENS.txt");
  app->add_option("--head", args->head, "Head of the heatmap (the page shows all)")
      ->check(integer_in(0))
      ->type_name("H");
  app->add_option("--batch", args->batch, "Batch entry to draw")
      ->check(integer_in(0))
      ->type_name("B");
  app->add_option("--downsample", args->downsample,
                  "How a block of weights becomes one cell in large matrices: max keeps peaks "
                  "visible, mean shows average weight")
      ->check(CLI::IsMember({"max", "mean"}))
      ->type_name("max|mean");
  app->add_option("--max-cells", args->max_cells,
                  "Cells per side at most; 0: 512 for heatmaps, 128 per head for the page")
      ->check(integer_in(0))
      ->type_name("N");
  app->add_option("--title", args->title, "Title [default: names the batch entry and head]");
  CLI::Option* blend =
      app->add_flag("--blend", args->blend,
                    "Draw one query's context as a blend of the value vectors (needs --value)");
  app->add_option(
         "--value", args->value,
         "With --blend: values [B, Hkv, Lk, Dv], [Hkv, Lk, Dv] or [Lk, Dv] (float16/32/64)")
      ->needs(blend)
      ->type_name("V.npy");
  app->add_option("--row", args->row, "With --blend: the query whose context is drawn")
      ->needs(blend)
      ->check(CLI::NonNegativeNumber)
      ->type_name("R");
  app->add_option("--top", args->top,
                  "With --blend: inputs drawn in full, by weight; the rest are summed into one row")
      ->needs(blend)
      ->check(CLI::PositiveNumber)
      ->type_name("K");
  return {app, [args] { run_viz(*args); }};
}

}  // namespace attn::tools
