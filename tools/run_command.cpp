// `attn run`: attention on .npy files. Everything is read and checked, then computed, then
// written: outputs are staged under temporary names and renamed into place only after
// every one of them was written and every target was checked, so a failure leaves every
// output path as it was. On a terminal, a job that takes more than a second shows a
// progress bar on stderr.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "command.hpp"
#include "compute_options.hpp"
#include "core/memory.hpp"
#include "distributed_run.hpp"
#include "forward_in_pieces.hpp"
#include "io/npy.hpp"
#include "layout.hpp"
#include "progress_bar.hpp"
#include "run_args.hpp"
#include "tokens_file.hpp"
#include "viz/draw.hpp"

namespace attn::tools {
namespace {

// An input array with its [b, h, s, d] view in the chosen layout.
struct Input {
  io::NpyArray array;
  TensorView view;
};

Input read_input(const std::string& path, Layout layout) {
  Input input{io::read_npy(path), {}};
  const Placement placement = place(layout, input.array.shape);
  input.view = TensorView(input.array.tensor.data(), input.array.tensor.dtype(), placement.shape,
                          placement.strides);
  return input;
}

// An output: storage in file order, the [b, h, s, d] view the library writes through, and
// the shape the file will have.
struct Output {
  Tensor storage;
  MutableTensorView view;
  io::Shape shape;
};

Output make_output(DType dtype, Layout layout, const Dims& bhsd, std::size_t rank) {
  Output output;
  output.shape = file_shape(layout, bhsd, rank);
  output.storage = Tensor(dtype, io::right_aligned(output.shape));
  const Placement placement = place(layout, output.shape);
  output.view = MutableTensorView(output.storage.data(), dtype, placement.shape, placement.strides);
  return output;
}

io::StagedFile stage(const std::string& path, const Output& output) {
  const TensorView stored(output.storage.data(), output.storage.dtype(), output.storage.shape());
  return io::stage_npy(path, stored, output.shape);
}

void run(const RunArgs& args) {
  if (args.distributed) {
    run_distributed(args);
    return;
  }
  if (!args.sharding.empty()) throw Error("--sharding: expected only with --distributed");
  check_outputs(args);
  if (!args.viz.empty()) viz::format_of(args.viz, "--viz");  // a bad name fails before work
  if (args.viz_show != "weights" && args.viz.empty()) {
    throw Error("--viz-show: expected only with --viz");
  }
  const bool draw_contributions = args.viz_show == "contributions";
  const Layout layout = parse_layout(args.layout);
  const Input q = read_input(args.query, layout);
  const Input k = read_input(args.key, layout);
  const Input v = read_input(args.value, layout);

  Options options = options_without_mask(args);
  // The mask is [B or 1, H or 1, Lq, Lk] whatever the layout, as in PyTorch.
  std::optional<Input> mask;
  if (!args.mask.empty()) {
    mask = read_input(args.mask, Layout::bhsd);
    options.mask = mask->view;
  }

  const std::size_t rank = q.array.shape.size();
  const Index batch = q.view.shape[0], heads = q.view.shape[1], len_q = q.view.shape[2];
  const Index len_k = k.view.shape[2], dim_v = v.view.shape[3];
  const DType stats_dtype = q.view.dtype == DType::f64 ? DType::f64 : DType::f32;
  Output context = make_output(q.view.dtype, layout, {batch, heads, len_q, dim_v}, rank);
  Outputs outputs{context.view, std::nullopt, std::nullopt};
  std::optional<Output> lse, weights;
  if (!args.lse.empty()) {
    // One value per query row, [B, H, Lq] in every layout (as FlashAttention's softmax_lse);
    // the leading 1 stands in for the dim that the trailing 1 of [B, H, Lq, 1] takes away.
    lse = make_output(stats_dtype, Layout::bhsd, {1, batch, heads, len_q}, rank > 0 ? rank - 1 : 0);
    outputs.lse = MutableTensorView(lse->storage.data(), stats_dtype, {batch, heads, len_q, 1});
  }
  // --viz draws from the weights, so they are computed even when not saved; the matrix of
  // a long sequence is easily more than the machine holds.
  if (!args.weights.empty() || (!args.viz.empty() && !draw_contributions)) {
    const Dims dims{batch, heads, len_q, len_k};
    core::check_memory(std::string(args.weights.empty() ? "--viz" : "--weights") +
                           ": the weights " + format_dims(dims) + " of " + dtype_name(stats_dtype),
                       core::bytes_of(dims, dtype_size(stats_dtype)),
                       "leave out --weights and --viz, or compute chosen rows or the top_k "
                       "largest of each row with attn.weights in Python");
    weights = make_output(stats_dtype, Layout::bhsd, {batch, heads, len_q, len_k}, rank);
    outputs.weights = weights->view;
  }
  if (!args.viz.empty()) check_index("--viz-head", args.viz_head, heads);
  // The picture of --viz: head --viz-head of batch entry 0, its labels checked here.
  viz::Picture picture;
  picture.head = args.viz_head;
  if (!args.viz.empty())
    picture.tokens = read_tokens(args.viz_tokens, "--viz-tokens", len_q, len_k);
  const bool show_progress = !args.quiet && stderr_is_terminal();
  if (show_progress) {
    run_with_progress_bar("attn run", [&](const ProgressCallback& progress) {
      forward_in_pieces(q.view, k.view, v.view, options, outputs, progress);
    });
  } else {
    forward_into(q.view, k.view, v.view, options, outputs);
  }

  // alpha_ij ||v_j|| (attn/contributions.hpp): the weights' bits times float64 norms,
  // [B, Hq, Lq, Lk] as the weights.
  Tensor contributed;
  if (!args.contributions.empty() || draw_contributions) {
    contributed = contributions(q.view, k.view, v.view, options);
    picture.title = "||alpha_ij v_j||: what input j adds to query i";
  }

  std::vector<io::StagedFile> staged;
  staged.push_back(stage(args.out, context));
  if (lse) staged.push_back(stage(args.lse, *lse));
  if (!args.weights.empty()) staged.push_back(stage(args.weights, *weights));
  if (!args.contributions.empty()) {
    staged.push_back(io::stage_npy(args.contributions, contributed.view(),
                                   file_shape(Layout::bhsd, contributed.shape(), rank)));
  }
  if (!args.viz.empty()) {
    staged.push_back(viz::stage(draw_contributions ? contributed.view() : weights->view, args.viz,
                                picture, "--viz"));
  }
  io::commit_all(staged);
}

}  // namespace

Command add_run_command(CLI::App& parent) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* app = parent.add_subcommand("run", "Attention on .npy arrays: context, weights, lse");
  app->footer(
      "Computes C = softmax(scale * Q K^T + mask) V for every query row and head. Arrays are "
      ".npy files of float16, float32 or float64; 2-D [L, D] and 3-D [H, L, D] files have "
      "leading dims of 1. The context has the query's dtype and rank; lse and weights are "
      "float32 (float64 for a float64 query). Outputs appear only once all of them are "
      "computed and written; an output path that exists must be a regular file (a symlink to one "
      "is followed; devices and directories are refused). On bad input attn prints one line "
      "and exits with status 2; on SIGINT or SIGTERM it removes its unfinished files and exits "
      "with 128 + the signal number.");
  app->option_defaults()->always_capture_default();

  app->add_option("--query", args->query, "Q: [B, Hq, Lq, D] (in --layout order)")
      ->required()
      ->type_name("Q.npy");
  app->add_option("--key", args->key, "K: [B, Hkv, Lk, D]; Hkv divides Hq (GQA/MQA)")
      ->required()
      ->type_name("K.npy");
  app->add_option("--value", args->value, "V: [B, Hkv, Lk, Dv]")->required()->type_name("V.npy");
  app->add_option("--out", args->out, "Where the context goes: [B, Hq, Lq, Dv] in --layout order")
      ->required()
      ->type_name("C.npy");
  app->add_option("--weights", args->weights,
                  "Also write the weights alpha: [B, Hq, Lq, Lk] (rows sum to 1 less the sink's "
                  "share) [default: not written]")
      ->type_name("W.npy");
  app->add_option("--contributions", args->contributions,
                  "Also write what each input adds to each query's context, beyond its weight: "
                  "||alpha_ij v_j|| = alpha_ij ||v_j||, [B, Hq, Lq, Lk] as --weights "
                  "(Kobayashi et al. 2020) [default: not written]")
      ->type_name("N.npy");
  app->add_option("--lse", args->lse,
                  "Also write the log-sum-exp of each row's scores: [B, Hq, Lq]; -inf for a row "
                  "that sees no key [default: not written]")
      ->type_name("L.npy");
  app->add_option("--mask", args->mask,
                  "[B or 1, Hq or 1, Lq, Lk] in any layout: bool (true = may attend) or float "
                  "(added to the scores; -inf hides) [default: none]")
      ->type_name("M.npy");
  CLI::Option* causal =
      app->add_option(
             "--causal", args->causal_align,
             "Hide keys after each query's position. top-left (PyTorch): query i sits at "
             "key i; bottom-right (FlashAttention): query i sits at key i + Lk - Lq. A bare "
             "--causal means top-left [default: off]")
          ->expected(0, 1)
          ->check(CLI::IsMember({"top-left", "bottom-right"}))
          ->type_name("[ALIGN]");
  app->add_option_function<double>(
         "--scale", [args](const double& scale) { args->scale = scale; },
         "Multiplies q . k [default: 1/sqrt(D)]")
      ->type_name("S");
  app->add_option("--window", args->window,
                  "Sliding window: query at key position p sees keys p-L .. p+R; -1 means "
                  "unbounded on that side [default: off]")
      ->check(CLI::Validator(
          [](const std::string& text) {
            return parse_window(text) ? std::string()
                                      : "expected L,R with integers >= -1, given '" + text + "'";
          },
          ""))
      ->type_name("L,R");
  app->add_option("--softcap", args->softcap,
                  "Logit soft cap c: score = c * tanh(score / c); 0 is off")
      ->type_name("X");
  app->add_option("--alibi", args->alibi,
                  "ALiBi slopes, 1-D [Hq]: score -= slope * |query pos - key pos| [default: none]")
      ->type_name("SLOPES.npy");
  app->add_option("--sinks", args->sinks,
                  "Attention sinks, 1-D [Hq]: one extra logit per head that takes weight and has "
                  "no value [default: none]")
      ->type_name("S.npy");
  app->add_option("--layout", args->layout,
                  "Order of dims in the Q, K, V and context files: bhsd = [B, H, S, D] "
                  "(3-D [H, S, D]), bshd = [B, S, H, D] (3-D [S, H, D]), read without a copy")
      ->check(CLI::IsMember({"bhsd", "bshd"}))
      ->type_name("LAYOUT");
  app->add_option("--viz", args->viz,
                  "Also draw the weights: a heatmap of one head (.svg, .png) or a page of every "
                  "head (.html) of batch entry 0 [default: not drawn]")
      ->type_name("FILE");
  app->add_option("--viz-show", args->viz_show,
                  "What --viz draws: the weights alpha_ij, or each input's contribution "
                  "||alpha_ij v_j|| (a large weight on a small value adds little)")
      ->check(CLI::IsMember({"weights", "contributions"}))
      ->type_name("WHAT");
  app->add_option("--viz-head", args->viz_head, "Head of the --viz heatmap")
      ->check(integer_in(0))
      ->type_name("H");
  app->add_option("--viz-tokens", args->viz_tokens,
                  "Labels for --viz: UTF-8 text, one token per line (Lq or Lk of them) "
                  "[default: indices]")
      ->type_name("TOKENS.txt");
  app->add_flag("--distributed", args->distributed,
                "Split the sequence over the ranks that mpirun started (mpirun -np N attn run "
                "--distributed ...): each rank reads only its rows of the inputs, ring "
                "attention passes keys and values between ranks, and each rank writes its rows "
                "of --out and --lse into one file. No --mask, --weights, --contributions or --viz");
  app->add_option("--sharding", args->sharding,
                  "With --distributed, which rows each rank holds: contiguous (rank r the r-th "
                  "run of rows) or zigzag (rank r of N chunks r and 2N-1-r of 2N, the same "
                  "work per rank under --causal; lengths divisible by 2N) [default: contiguous]")
      ->check(CLI::IsMember({"contiguous", "zigzag"}))
      ->type_name("SHARDING");
  app->add_flag("--quiet", args->quiet,
                "No progress bar (it shows on a terminal for jobs longer than a second)");
  add_compute_options(*app, args->compute);
  return {app, [args, causal] {
            // A bare --causal has no value: the option's count says whether it was given.
            args->causal = causal->count() > 0;
            run(*args);
          }};
}

}  // namespace attn::tools
