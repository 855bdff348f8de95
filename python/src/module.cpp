// attn._attn, the extension behind attn/__init__.py. Its functions take 4-D [B, H, S, D]
// arrays that the Python layer has already shaped and checked for kind; this side checks
// dtype, device and strides again and reads the caller's memory without copying. The GIL
// is released while a kernel runs.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "block_mask.hpp"
#include "core/memory.hpp"
#include "errors.hpp"
#include "generation.hpp"
#include "options.hpp"
#include "paged.hpp"
#include "views.hpp"
#include "viz/blend_steps.hpp"
#include "viz/draw.hpp"
#include "viz/model_page.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace attn::python {
namespace {

// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]  mask: [B or 1, Hq or 1, Lq, Lk]
// out: [B, Hq, Lq, Dv]  lse: [B, Hq, Lq, 1]  weights: [B, Hq, Lq, Lk]
void forward(const InputArray& q, const InputArray& k, const InputArray& v, const OutputArray& out,
             const std::optional<OutputArray>& lse, const std::optional<OutputArray>& weights,
             const std::optional<InputArray>& mask, const Options& options) {
  const Options with = with_mask(options, mask);
  Outputs outputs{output_view(out, "out"), std::nullopt, std::nullopt};
  if (lse) outputs.lse = output_view(*lse, "lse");
  if (weights) outputs.weights = output_view(*weights, "weights");
  const TensorView q_view = input_view(q, "q"), k_view = input_view(k, "k");
  const TensorView v_view = input_view(v, "v");
  {
    nb::gil_scoped_release unlocked;
    forward_into(q_view, k_view, v_view, with, outputs);
  }
  warn_fallback();
}

// q, k, v, out, dout as for forward  lse: [B, Hq, Lq, 1]  dq, dk, dv: the shapes of q, k, v
// dsinks: [1, Hq, 1, 1], exactly when sinks are given
void backward(const InputArray& q, const InputArray& k, const InputArray& v, const InputArray& out,
              const InputArray& lse, const InputArray& dout, const OutputArray& dq,
              const OutputArray& dk, const OutputArray& dv,
              const std::optional<OutputArray>& dsinks,
              const std::optional<OutputArray>& dposition_bias,
              const std::optional<InputArray>& mask, const Options& options) {
  const Options with = with_mask(options, mask);
  const BackwardInputs inputs{input_view(q, "q"),     input_view(k, "k"),
                              input_view(v, "v"),     input_view(out, "out"),
                              input_view(lse, "lse"), input_view(dout, "dout")};
  Gradients gradients{output_view(dq, "dq"), output_view(dk, "dk"), output_view(dv, "dv"),
                      std::nullopt, std::nullopt};
  if (dsinks) gradients.dsinks = output_view(*dsinks, "dsinks");
  if (dposition_bias) gradients.dposition_bias = output_view(*dposition_bias, "dposition_bias");
  {
    nb::gil_scoped_release unlocked;
    backward_into(inputs, with, gradients);
  }
  warn_fallback();
}

using IndexArray = nb::ndarray<std::int64_t, nb::c_contig, nb::device::cpu>;

// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  out: [B, heads, rows, Lk], or [B, heads, rows, k]
// with top_k, and then indices: int64 of the same shape
void weights(const InputArray& q, const InputArray& k, const OutputArray& out,
             const std::optional<IndexArray>& indices, std::vector<Index> heads,
             std::vector<Index> rows, std::optional<Index> top_k,
             const std::optional<InputArray>& mask, const Options& options) {
  const Options with = with_mask(options, mask);
  WeightSelection selection{std::move(heads), std::move(rows), top_k};
  const MutableTensorView out_view = output_view(out, "weights");
  std::int64_t* index_data = nullptr;
  if (indices) {
    const bool same_shape = indices->ndim() == 4 && indices->shape(0) == out.shape(0) &&
                            indices->shape(1) == out.shape(1) &&
                            indices->shape(2) == out.shape(2) && indices->shape(3) == out.shape(3);
    if (!same_shape) throw Error("indices: expected the shape of weights, given another");
    index_data = indices->data();
  }
  const TensorView q_view = input_view(q, "q"), k_view = input_view(k, "k");
  {
    nb::gil_scoped_release unlocked;
    weights_into(q_view, k_view, with, selection, out_view, index_data);
  }
  warn_fallback();
}

// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]  projection: [1, Hq, Dv, E]
// -> [B, heads, rows, Lk]
NumpyArray contributions(const InputArray& q, const InputArray& k, const InputArray& v,
                         std::vector<Index> heads, std::vector<Index> rows,
                         const std::optional<InputArray>& projection,
                         const std::optional<InputArray>& mask, const Options& options) {
  const Options with = with_mask(options, mask);
  const WeightSelection selection{std::move(heads), std::move(rows), std::nullopt};
  const TensorView q_view = input_view(q, "q"), k_view = input_view(k, "k"),
                   v_view = input_view(v, "v");
  std::optional<TensorView> projection_view;
  if (projection) projection_view = input_view(*projection, "output_projection");
  Tensor result;
  {
    nb::gil_scoped_release unlocked;
    result = attn::contributions(q_view, k_view, v_view, with, selection,
                                 projection_view ? &*projection_view : nullptr);
  }
  warn_fallback();
  return to_numpy(std::move(result));
}

// attn::rollout: weights [layers, H, L, L] -> float64 [layers, 1, L, L].
NumpyArray rollout(const InputArray& weights, double residual) {
  const TensorView view = input_view(weights, "weights");
  Tensor result;
  {
    nb::gil_scoped_release unlocked;
    result = attn::rollout(view, residual);
  }
  return to_numpy(std::move(result));
}

// attn::dropout_mask: [B, Hq, Lq, Lk] booleans, true where dropout keeps the weight.
NumpyArray dropout_mask(const Dims& shape, double dropout_p, std::uint64_t seed) {
  Tensor mask;
  {
    nb::gil_scoped_release unlocked;
    mask = attn::dropout_mask(shape, dropout_p, seed);
  }
  return to_numpy(std::move(mask));
}

// What attn::explain says of forward(q, k, v) with these options: {backend, reason, plan}.
nb::dict explain(const InputArray& q, const InputArray& k, const InputArray& v,
                 const std::optional<InputArray>& mask, const Options& options) {
  const Explanation e = attn::explain(input_view(q, "q"), input_view(k, "k"), input_view(v, "v"),
                                      with_mask(options, mask));
  nb::dict out;
  out["backend"] = e.backend == Backend::fast ? "fast" : "reference";
  out["reason"] = e.reason;
  out["plan"] = e.plan;
  return out;
}

ScoreKind score_kind(const std::string& kind) {
  if (kind == "dot") return ScoreKind::dot;
  if (kind == "scaled_dot") return ScoreKind::scaled_dot;
  if (kind == "general") return ScoreKind::general;
  if (kind == "additive") return ScoreKind::additive;
  throw Error("kind: expected 'dot', 'scaled_dot', 'general' or 'additive', given '" + kind + "'");
}

std::optional<TensorView> optional_view(const std::optional<InputArray>& array, const char* name) {
  if (!array) return std::nullopt;
  return input_view(*array, name);
}

// q: [B, Hq, Lq, Dq]  k: [B, Hkv, Lk, Dk]  weight: [1, 1, Dq, Dk]  query_projection:
// [1, 1, A, Dq]  key_projection: [1, 1, A, Dk]  energy: [1, 1, 1, A] -> [B, Hq, Lq, Lk]
NumpyArray scores(const InputArray& q, const InputArray& k, const std::string& kind,
                  std::optional<double> scale, const std::optional<InputArray>& weight,
                  const std::optional<InputArray>& query_projection,
                  const std::optional<InputArray>& key_projection,
                  const std::optional<InputArray>& energy) {
  ScoreParams params;
  params.kind = score_kind(kind);
  params.scale = scale;
  params.weight = optional_view(weight, "weight");
  params.query_projection = optional_view(query_projection, "query_projection");
  params.key_projection = optional_view(key_projection, "key_projection");
  params.energy = optional_view(energy, "energy");
  const TensorView q_view = input_view(q, "q"), k_view = input_view(k, "k");
  Tensor result;
  {
    nb::gil_scoped_release unlocked;
    result = attn::scores(q_view, k_view, params);
  }
  return to_numpy(std::move(result));
}

// scores: [B, H, Lq, Lk] -> weights of the same shape
NumpyArray softmax(const InputArray& scores) {
  const TensorView view = input_view(scores, "scores");
  Tensor result;
  {
    nb::gil_scoped_release unlocked;
    result = attn::softmax(view);
  }
  return to_numpy(std::move(result));
}

// weights: [B, Hq, Lq, Lk]  v: [B, Hkv, Lk, Dv] -> [B, Hq, Lq, Dv]
NumpyArray context(const InputArray& weights, const InputArray& v, bool check, double tolerance) {
  const TensorView weights_view = input_view(weights, "weights"), v_view = input_view(v, "v");
  Tensor result;
  {
    nb::gil_scoped_release unlocked;
    result = attn::context(weights_view, v_view, ContextCheck{check, tolerance});
  }
  return to_numpy(std::move(result));
}

// weights: [B, H, Lq, Lk] -> a picture file (format from the path's extension), written
// whole or not at all.
void draw(const InputArray& weights, const std::string& path, std::vector<std::string> tokens,
          std::vector<std::string> key_tokens, Index batch, Index head,
          const std::string& downsample, Index max_cells, const std::string& title) {
  viz::Picture picture;
  picture.batch = batch;
  picture.head = head;
  picture.tokens = std::move(tokens);
  picture.key_tokens = std::move(key_tokens);
  picture.title = title;
  picture.reduce = viz::parse_reduce(downsample, "downsample");
  picture.max_cells = max_cells;
  const TensorView view = input_view(weights, "weights");
  nb::gil_scoped_release unlocked;
  viz::draw(view, path, picture, "path");
}

// weights: [1, H, steps, Lk]  value: [1, Hkv, Lk, Dv] -> a page stepping through the rows'
// blends, written whole or not at all.
void draw_steps(const InputArray& weights, const InputArray& value, const std::string& path,
                std::vector<std::string> steps, std::vector<std::string> inputs, Index top,
                const std::string& title) {
  viz::BlendStepsOptions options;
  options.steps = std::move(steps);
  options.inputs = std::move(inputs);
  options.top = top;
  options.title = title;
  if (viz::format_of(path, "path") != viz::Format::html) {
    throw Error("path: expected a file name ending in .html or .htm, given '" + path + "'");
  }
  const TensorView weights_view = input_view(weights, "weights"),
                   value_view = input_view(value, "value");
  nb::gil_scoped_release unlocked;
  viz::stage_bytes(viz::blend_steps_html(weights_view, value_view, options), path).commit();
}

// weights: [B, H, Lq, Lk]  value: [B, Hkv, Lk, Dv] -> query `row`'s context drawn as a
// blend of the value vectors (format from the path's extension), written whole or not at all.
void draw_blend(const InputArray& weights, const InputArray& value, const std::string& path,
                std::vector<std::string> tokens, Index batch, Index head, Index row, Index top,
                const std::string& title) {
  viz::BlendOptions options;
  options.batch = batch;
  options.head = head;
  options.row = row;
  options.tokens = std::move(tokens);
  options.top = top;
  options.title = title;
  const viz::Format format = viz::format_of(path, "path");
  const TensorView weights_view = input_view(weights, "weights"),
                   value_view = input_view(value, "value");
  nb::gil_scoped_release unlocked;
  viz::stage_bytes(viz::render(viz::make_blend(weights_view, value_view, options), format), path)
      .commit();
}

// weights (and contributions): [layers, H, L, L] -> the whole-model HTML page, written whole
// or not at all.
void draw_model(const InputArray& weights, const std::string& path, std::vector<std::string> tokens,
                std::vector<bool> special, const std::string& title,
                const std::optional<InputArray>& contributions) {
  viz::ModelPageOptions options;
  options.tokens = std::move(tokens);
  options.special = std::move(special);
  options.title = title;
  if (viz::format_of(path, "path") != viz::Format::html) {
    throw Error("path: expected a file name ending in .html or .htm, given '" + path + "'");
  }
  const TensorView view = input_view(weights, "weights");
  if (contributions) options.contributions = input_view(*contributions, "contributions");
  nb::gil_scoped_release unlocked;
  viz::stage_bytes(viz::model_page_html(view, options), path).commit();
}

// What the kernels would see of `array`: its address, dtype, shape and element strides.
// The tests use it to show that inputs are read in place.
nb::dict describe_view(const InputArray& array, const std::string& name) {
  const TensorView view = input_view(array, name.c_str(), true);
  nb::dict description;
  description["data"] = reinterpret_cast<std::uintptr_t>(view.data);
  description["dtype"] = dtype_name(view.dtype);
  description["shape"] = nb::make_tuple(view.shape[0], view.shape[1], view.shape[2], view.shape[3]);
  description["strides"] =
      nb::make_tuple(view.strides[0], view.strides[1], view.strides[2], view.strides[3]);
  return description;
}

}  // namespace
}  // namespace attn::python

NB_MODULE(_attn, m) {
  using namespace attn::python;
  m.doc() = "attn's compiled core; use the functions of the attn package instead.";
  m.attr("version") = attn::version;
  // nanobind reports the instances still alive when the interpreter tears the module down
  // as "leaked". A program may well hold a KVCache to the end (a daemon thread serving
  // requests keeps its cache; Python never clears such a thread's references), and that is
  // no leak of ours, so the report would only alarm users. Reference-count mistakes in the
  // bindings are caught by tests/python/test_memory.py instead (no drift over 10000 calls).
  nb::set_leak_warnings(false);

  // attn.Error is a ValueError (bad input) and a RuntimeError, which is what PyTorch raises
  // for the same mistakes, so code written for either catches it. A result that cannot fit
  // in memory is a MemoryError.
  PyObject* error_type = PyErr_NewExceptionWithDoc(
      "attn.Error", "Bad input to attn: a ValueError and a RuntimeError.",
      nb::make_tuple(nb::handle(PyExc_ValueError), nb::handle(PyExc_RuntimeError)).ptr(), nullptr);
  m.attr("Error") = nb::steal(error_type);
  translate_errors(error_type);
  // Backend::automatic running the float64 reference (100x slower) says so, once per reason.
  PyObject* warning_type = PyErr_NewExceptionWithDoc(
      "attn.FallbackWarning",
      "attn ran its float64 reference because the fast kernels do not serve the call.",
      PyExc_UserWarning, nullptr);
  m.attr("FallbackWarning") = nb::steal(warning_type);
  route_fallback_notices(warning_type);

  bind_block_mask(m);
  bind_options(m);
  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, nb::kw_only(), "out"_a, "lse"_a.none(),
        "weights"_a.none(), "mask"_a.none(), "options"_a,
        "Attention of 4-D [B, H, S, D] views, written into out (and lse, weights).");
  m.def("backward", &backward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dout"_a, nb::kw_only(),
        "dq"_a, "dk"_a, "dv"_a, "dsinks"_a.none(), "dposition_bias"_a.none(), "mask"_a.none(),
        "options"_a,
        "Gradients of attention of 4-D [B, H, S, D] views, written into dq, dk, dv (and dsinks, "
        "dposition_bias).");
  m.def("bias_columns", &bias_columns, "buckets"_a, "columns"_a, "offset"_a, "max_distance"_a,
        "distances"_a, "The position bias table's column of each distance (attn::bias_column).");
  m.def("weights", &weights, "q"_a, "k"_a, nb::kw_only(), "out"_a, "indices"_a.none(), "heads"_a,
        "rows"_a, "top_k"_a.none(), "mask"_a.none(), "options"_a,
        "Softmax weights of 4-D [B, H, S, D] views, written into out (and indices for top_k).");
  m.def("contributions", &contributions, "q"_a, "k"_a, "v"_a, nb::kw_only(), "heads"_a, "rows"_a,
        "output_projection"_a.none(), "mask"_a.none(), "options"_a,
        "Weights of 4-D views times each key's value norm (through W_O by head when given).");
  m.def("rollout", &rollout, "weights"_a, "residual"_a,
        "Attention rollout over layers: [layers, H, L, L] -> [layers, 1, L, L].");
  m.def("dropout_mask", &dropout_mask, "shape"_a, "dropout_p"_a, "seed"_a,
        "Which weights dropout keeps: [B, Hq, Lq, Lk] booleans.");
  m.def("explain", &explain, "q"_a, "k"_a, "v"_a, nb::kw_only(), "mask"_a.none(), "options"_a,
        "The backend forward runs for these 4-D views and options, why, and its plan.");
  m.def("scores", &scores, "q"_a, "k"_a, nb::kw_only(), "kind"_a, "scale"_a.none(),
        "weight"_a.none(), "query_projection"_a.none(), "key_projection"_a.none(),
        "energy"_a.none(), "Scores [B, Hq, Lq, Lk] of 4-D q and k.");
  m.def("softmax", &softmax, "scores"_a, "Softmax over the last dim of a 4-D array.");
  m.def("context", &context, "weights"_a, "v"_a, nb::kw_only(), "check"_a, "tolerance"_a,
        "Context [B, Hq, Lq, Dv] = weights @ v of 4-D arrays.");
  m.def("draw", &draw, "weights"_a, "path"_a, nb::kw_only(), "tokens"_a, "key_tokens"_a, "batch"_a,
        "head"_a, "downsample"_a, "max_cells"_a, "title"_a,
        "A picture of 4-D weights [B, H, Lq, Lk] in the format of path's extension.");
  m.def("draw_blend", &draw_blend, "weights"_a, "value"_a, "path"_a, nb::kw_only(), "tokens"_a,
        "batch"_a, "head"_a, "row"_a, "top"_a, "title"_a,
        "Query row's context as a blend of the values, in the format of path's extension.");
  m.def("draw_steps", &draw_steps, "weights"_a, "value"_a, "path"_a, nb::kw_only(), "steps"_a,
        "inputs"_a, "top"_a, "title"_a, "A page stepping through the blends of every row.");
  m.def("draw_model", &draw_model, "weights"_a, "path"_a, nb::kw_only(), "tokens"_a, "special"_a,
        "title"_a, "contributions"_a.none(),
        "A self-contained HTML page of 4-D weights [layers, H, L, L], every layer.");
  m.def("check_memory", &attn::core::check_memory, "what"_a, "bytes"_a, "instead"_a,
        "Raises MemoryError saying what to do instead when bytes exceed the memory available.");
  m.def("describe_view", &describe_view, "array"_a, "name"_a,
        "The address, dtype, shape and element strides the kernels would read.");
  bind_generation(m);
  bind_paged(m);
}
