#include "translator_layers.hpp"

#include <algorithm>
#include <cmath>

namespace attn::tools {
namespace {

// Threads only for products worth a parallel region (larger than the demo's tiny test
// models): a region costs more than a small product, most of all on a busy machine.
constexpr Index kParallelWork = Index{1} << 16;

// y[0, n) += a x[0, n), contiguous so that it vectorises.
void add_scaled(float* y, const float* x, float a, Index n) {
  for (Index j = 0; j < n; ++j) y[j] += a * x[j];
}

// c[i, :] += sum over k of a(i, k) b[k, :], k in order, for the m rows of c, where
// a(i, k) = a[i * a_row + k * a_column] (a transposed is a change of strides). A block of
// kBlock columns of c stays in registers over k; threads split the rows of c.
void multiply_add(const float* a, Index a_row, Index a_column, const Matrix& b, Matrix& c,
                  Index depth) {
  constexpr Index kBlock = 32;
  const Index n = c.cols;
#pragma omp parallel for schedule(static) if (c.rows * n * depth > kParallelWork)
  for (Index i = 0; i < c.rows; ++i) {
    float* out = c.row(i);
    Index j = 0;
    for (; j + kBlock <= n; j += kBlock) {
      float block[kBlock];
      std::copy_n(out + j, kBlock, block);
      for (Index k = 0; k < depth; ++k) {
        const float scale = a[i * a_row + k * a_column];
        const float* row = b.row(k) + j;
        for (Index jj = 0; jj < kBlock; ++jj) block[jj] += scale * row[jj];
      }
      std::copy_n(block, kBlock, out + j);
    }
    for (Index k = 0; j < n && k < depth; ++k) {
      add_scaled(out + j, b.row(k) + j, a[i * a_row + k * a_column], n - j);
    }
  }
}

}  // namespace

void add_into(Matrix& a, const Matrix& b) {
  for (std::size_t i = 0; i < a.values.size(); ++i) a.values[i] += b.values[i];
}

Parameter::Parameter(Index rows, Index cols)
    : value(rows, cols), grad(rows, cols), moment1(rows, cols), moment2(rows, cols) {}

Linear::Linear(Index in, Index out, ToyRandom& rng) : weight(in, out), bias(1, out) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  for (float& w : weight.value.values) w = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
  for (float& b : bias.value.values) b = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
}

Matrix Linear::forward(const Matrix& x) const {
  Matrix y(x.rows, weight.value.cols);
  for (Index i = 0; i < y.rows; ++i) std::copy_n(bias.value.values.data(), y.cols, y.row(i));
  multiply_add(x.values.data(), x.cols, 1, weight.value, y, x.cols);
  return y;
}

void Linear::backward(const Matrix& x, const Matrix& dy, Matrix& dx) {
  const Index in = weight.value.rows, out = weight.value.cols;
  Matrix transposed(out, in);
  for (Index k = 0; k < in; ++k) {
    for (Index j = 0; j < out; ++j) transposed.row(j)[k] = weight.value.row(k)[j];
  }
  multiply_add(dy.values.data(), out, 1, transposed, dx, out);
  multiply_add(x.values.data(), 1, in, dy, weight.grad, x.rows);
  for (Index i = 0; i < dy.rows; ++i) add_scaled(bias.grad.row(0), dy.row(i), 1.0f, out);
}

LayerNorm::LayerNorm(Index dim) : gain(1, dim), bias(1, dim) {
  std::fill(gain.value.values.begin(), gain.value.values.end(), 1.0f);
}

Matrix LayerNorm::forward(const Matrix& x, Saved& saved) const {
  const Index n = x.cols;
  saved.normalised = Matrix(x.rows, n);
  saved.inverse_deviation.assign(static_cast<std::size_t>(x.rows), 0.0f);
  Matrix y(x.rows, n);
  for (Index i = 0; i < x.rows; ++i) {
    const float* in = x.row(i);
    double sum = 0.0, squares = 0.0;
    for (Index j = 0; j < n; ++j) sum += in[j];
    const double mean = sum / static_cast<double>(n);
    for (Index j = 0; j < n; ++j) squares += (in[j] - mean) * (in[j] - mean);
    const auto inverse =
        static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(n) + 1e-5));
    saved.inverse_deviation[static_cast<std::size_t>(i)] = inverse;
    float* normalised = saved.normalised.row(i);
    for (Index j = 0; j < n; ++j) {
      normalised[j] = (in[j] - static_cast<float>(mean)) * inverse;
      y.row(i)[j] = normalised[j] * gain.value.values[static_cast<std::size_t>(j)] +
                    bias.value.values[static_cast<std::size_t>(j)];
    }
  }
  return y;
}

void LayerNorm::backward(const Saved& saved, const Matrix& dy, Matrix& dx) {
  const Index n = dy.cols;
  std::vector<float> dnormalised(static_cast<std::size_t>(n));
  for (Index i = 0; i < dy.rows; ++i) {
    const float* normalised = saved.normalised.row(i);
    const float* d = dy.row(i);
    double mean_d = 0.0, mean_dx = 0.0;
    for (Index j = 0; j < n; ++j) {
      const auto u = static_cast<std::size_t>(j);
      gain.grad.values[u] += d[j] * normalised[j];
      bias.grad.values[u] += d[j];
      dnormalised[u] = d[j] * gain.value.values[u];
      mean_d += dnormalised[u];
      mean_dx += dnormalised[u] * normalised[j];
    }
    mean_d /= static_cast<double>(n);
    mean_dx /= static_cast<double>(n);
    const float inverse = saved.inverse_deviation[static_cast<std::size_t>(i)];
    for (Index j = 0; j < n; ++j) {
      dx.row(i)[j] +=
          inverse * (dnormalised[static_cast<std::size_t>(j)] - static_cast<float>(mean_d) -
                     normalised[j] * static_cast<float>(mean_dx));
    }
  }
}

Matrix relu(const Matrix& x) {
  Matrix y = x;
  for (float& value : y.values) value = std::max(value, 0.0f);
  return y;
}

void relu_backward(const Matrix& y, const Matrix& dy, Matrix& dx) {
  for (std::size_t i = 0; i < y.values.size(); ++i) {
    if (y.values[i] > 0.0f) dx.values[i] += dy.values[i];
  }
}

Embedding::Embedding(Index words, Index dim, ToyRandom& rng) : table(words, dim) {
  for (float& value : table.value.values) value = static_cast<float>(rng.normal());
}

Matrix Embedding::forward(const std::vector<int>& ids) const {
  Matrix x(static_cast<Index>(ids.size()), table.value.cols);
  for (Index i = 0; i < x.rows; ++i) {
    std::copy_n(table.value.row(ids[static_cast<std::size_t>(i)]), x.cols, x.row(i));
  }
  return x;
}

void Embedding::backward(const std::vector<int>& ids, const Matrix& dy) {
  for (Index i = 0; i < dy.rows; ++i) {
    add_scaled(table.grad.row(ids[static_cast<std::size_t>(i)]), dy.row(i), 1.0f, dy.cols);
  }
}

double cross_entropy(const Matrix& logits, const std::vector<int>& targets, Matrix& dlogits) {
  dlogits = Matrix(logits.rows, logits.cols);
  const double rows = static_cast<double>(logits.rows);
  double loss = 0.0;
  for (Index i = 0; i < logits.rows; ++i) {
    const float* z = logits.row(i);
    const float top = *std::max_element(z, z + logits.cols);
    double sum = 0.0;
    for (Index j = 0; j < logits.cols; ++j) sum += std::exp(static_cast<double>(z[j] - top));
    const auto target = targets[static_cast<std::size_t>(i)];
    loss += std::log(sum) - static_cast<double>(z[target] - top);
    for (Index j = 0; j < logits.cols; ++j) {
      const double p = std::exp(static_cast<double>(z[j] - top)) / sum;
      dlogits.row(i)[j] = static_cast<float>((p - (j == target ? 1.0 : 0.0)) / rows);
    }
  }
  return loss / rows;
}

Adam::Adam(std::vector<Parameter*> parameters, float learning_rate)
    : parameters_(std::move(parameters)), learning_rate_(learning_rate) {}

void Adam::step() {
  constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEpsilon = 1e-8;
  ++steps_;
  const double correction1 = 1.0 - std::pow(kBeta1, steps_);
  const double correction2 = 1.0 - std::pow(kBeta2, steps_);
  for (Parameter* p : parameters_) {
    for (std::size_t i = 0; i < p->value.values.size(); ++i) {
      const double g = p->grad.values[i];
      const double m = kBeta1 * p->moment1.values[i] + (1.0 - kBeta1) * g;
      const double v = kBeta2 * p->moment2.values[i] + (1.0 - kBeta2) * g * g;
      p->moment1.values[i] = static_cast<float>(m);
      p->moment2.values[i] = static_cast<float>(v);
      p->value.values[i] -= static_cast<float>(learning_rate_ * (m / correction1) /
                                               (std::sqrt(v / correction2) + kEpsilon));
      p->grad.values[i] = 0.0f;
    }
  }
}

}  // namespace attn::tools
