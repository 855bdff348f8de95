#include "viz/blend.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "attn/lesson.hpp"
#include "core/rows.hpp"
#include "viz/tokens.hpp"

namespace attn::viz {
namespace {

// A weights row may hold float16 or bfloat16 numbers, whose rounding over many keys adds up
// to a few thousandths; scores passed by mistake are off by far more.
constexpr double kRowSumTolerance = 1e-2;

void check_in_range(const char* argument, Index value, Index count, const Dims& weights) {
  if (value < 0 || value >= count) {
    throw Error(std::string(argument) + ": expected 0 .. " + std::to_string(count - 1) +
                " (weights " + format_dims(weights) + "), given " + std::to_string(value));
  }
}

// t[b, h, s, :] for s in [0, rows) -> row-major [rows, t.shape[3]]; throws naming `argument`
// at the first non-finite number.
std::vector<double> load_rows(const TensorView& t, Index b, Index h, Index first, Index rows,
                              const char* argument) {
  const Index cols = t.shape[3];
  std::vector<double> out(static_cast<std::size_t>(rows * cols));
  for (Index s = 0; s < rows; ++s) {
    double* row = out.data() + s * cols;
    core::load_row(t, b, h, first + s, row);
    const double* bad = std::find_if(row, row + cols, [](double x) { return !std::isfinite(x); });
    if (bad != row + cols) {
      throw Error(std::string(argument) + ": expected finite values, given " +
                  std::to_string(*bad) + " at [" + std::to_string(b) + ", " + std::to_string(h) +
                  ", " + std::to_string(first + s) + ", " + std::to_string(bad - row) + "]");
    }
  }
  return out;
}

void check_shapes(const TensorView& weights, const TensorView& value,
                  const BlendArgumentNames& names) {
  const Dims &w = weights.shape, &v = value.shape;
  for (const auto& [view, name] : {std::pair{weights, names.weights}, {value, names.value}}) {
    if (view.dtype == DType::boolean) {
      throw Error(std::string(name) +
                  ": expected float16, bfloat16, float32 or float64, given bool");
    }
  }
  if (w[1] < 1 || w[2] < 1 || w[3] < 1) {
    throw Error(std::string(names.weights) +
                ": expected at least one head, query row and key, given shape " + format_dims(w));
  }
  if (v[0] != w[0] || v[1] < 1 || w[1] % v[1] != 0 || v[2] != w[3] || v[3] < 1) {
    throw Error(std::string(names.value) + ": expected [B, Hkv, Lk, Dv] = [" +
                std::to_string(w[0]) + ", a divisor of " + std::to_string(w[1]) + ", " +
                std::to_string(w[3]) + ", at least 1] to match " + names.weights + " " +
                format_dims(w) + ", given " + format_dims(v));
  }
}

}  // namespace

// weights: [B, H, Lq, Lk]  value: [B, Hkv, Lk, Dv]
Blend make_blend(const TensorView& weights, const TensorView& value, const BlendOptions& options) {
  const BlendArgumentNames& names = options.names;
  check_shapes(weights, value, names);
  const Dims& w = weights.shape;
  const Index len_k = w[3], dim_v = value.shape[3];
  check_in_range(names.batch, options.batch, w[0], w);
  check_in_range(names.head, options.head, w[1], w);
  check_in_range(names.row, options.row, w[2], w);
  check_label_count(options.tokens, len_k, names.tokens, "input");
  if (options.top < 1) {
    throw Error(std::string(names.top) + ": expected at least 1, given " +
                std::to_string(options.top));
  }
  const std::vector<double> alpha =
      load_rows(weights, options.batch, options.head, options.row, 1, names.weights);
  const auto negative = std::find_if(alpha.begin(), alpha.end(), [](double a) { return a < 0.0; });
  if (negative != alpha.end()) {
    throw Error(std::string(names.weights) + ": expected weights >= 0, given " +
                std::to_string(*negative) + " at key " + std::to_string(negative - alpha.begin()) +
                " of row " + std::to_string(options.row));
  }
  const double sum = std::accumulate(alpha.begin(), alpha.end(), 0.0);
  if (sum != 0.0 && std::abs(sum - 1.0) > kRowSumTolerance) {
    throw Error(std::string(names.weights) + ": expected weights that sum to 1 (or 0 where " +
                "every key is masked), given row " + std::to_string(options.row) + " of head " +
                std::to_string(options.head) + " summing to " + std::to_string(sum));
  }
  const Index value_head = options.head / (w[1] / value.shape[1]);
  const std::vector<double> values =
      load_rows(value, options.batch, value_head, 0, len_k, names.value);

  Blend blend;
  blend.title = options.title.empty()
                    ? "Query " + std::to_string(options.row) +
                          (w[1] > 1 ? " of head " + std::to_string(options.head) : "") +
                          ": C = sum_i alpha_i v_i, a blend of the value vectors"
                    : options.title;
  // The picture's C is attn's own; the weights were checked above.
  const Tensor context = attn::context(TensorView(alpha.data(), DType::f64, {1, 1, 1, len_k}),
                                       TensorView(values.data(), DType::f64, {1, 1, len_k, dim_v}),
                                       ContextCheck{.enabled = false, .tolerance = 0.0});
  blend.context.assign(context.data_as<double>(), context.data_as<double>() + dim_v);

  // The `top` largest weights (the earlier input on ties) in full, unless only one would be
  // left over: a rest of one input is that input.
  std::vector<Index> order(static_cast<std::size_t>(len_k));
  std::iota(order.begin(), order.end(), Index{0});
  const Index shown = len_k <= options.top + 1 ? len_k : options.top;
  std::stable_sort(order.begin(), order.end(), [&](Index a, Index b) {
    return alpha[static_cast<std::size_t>(a)] > alpha[static_cast<std::size_t>(b)];
  });
  std::sort(order.begin(), order.begin() + shown);

  const auto row_of = [&](Index j) {
    return std::span<const double>(values.data() + j * dim_v, static_cast<std::size_t>(dim_v));
  };
  for (Index i = 0; i < shown; ++i) {
    const Index j = order[static_cast<std::size_t>(i)];
    BlendRow row;
    row.label = std::to_string(j);
    if (!options.tokens.empty()) row.label += " " + options.tokens[static_cast<std::size_t>(j)];
    row.weight = alpha[static_cast<std::size_t>(j)];
    row.value.assign(row_of(j).begin(), row_of(j).end());
    for (const double x : row.value) row.scaled.push_back(row.weight * x);
    blend.rows.push_back(std::move(row));
  }
  if (shown < len_k) {
    BlendRow rest;
    rest.count = len_k - shown;
    rest.label = "rest: " + std::to_string(rest.count) + " inputs";
    rest.scaled.assign(static_cast<std::size_t>(dim_v), 0.0);
    std::vector<double> mean(static_cast<std::size_t>(dim_v), 0.0);
    for (Index i = shown; i < len_k; ++i) {
      const Index j = order[static_cast<std::size_t>(i)];
      const double a = alpha[static_cast<std::size_t>(j)];
      rest.weight += a;
      for (Index d = 0; d < dim_v; ++d) {
        rest.scaled[static_cast<std::size_t>(d)] += a * row_of(j)[static_cast<std::size_t>(d)];
        mean[static_cast<std::size_t>(d)] +=
            row_of(j)[static_cast<std::size_t>(d)] / static_cast<double>(rest.count);
      }
    }
    // The rest's value is what its total weight multiplies: their weighted mean (the plain
    // mean when they carry no weight at all).
    rest.value = mean;
    if (rest.weight > 0.0) {
      for (Index d = 0; d < dim_v; ++d) {
        rest.value[static_cast<std::size_t>(d)] =
            rest.scaled[static_cast<std::size_t>(d)] / rest.weight;
      }
    }
    blend.rows.push_back(std::move(rest));
  }
  return blend;
}

}  // namespace attn::viz
