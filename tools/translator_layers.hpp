// The dense layers of the translation demo's small Transformer (translator.hpp), forward
// and backward on row-major float32 matrices with one row per token, and Adam. Every
// backward adds into the gradients it is given, so a value read by several layers (a
// residual stream, the input of q, k and v) collects each reader's term. Rows are split
// between threads and every sum runs in a fixed order, so a step's bits do not depend on
// the thread count.
#pragma once

#include <vector>

#include "attn/tensor.hpp"
#include "toy_language.hpp"

namespace attn::tools {

struct Matrix {
  Index rows = 0, cols = 0;
  std::vector<float> values;

  Matrix() = default;
  Matrix(Index rows_, Index cols_)
      : rows(rows_), cols(cols_), values(static_cast<std::size_t>(rows_ * cols_), 0.0f) {}
  float* row(Index r) { return values.data() + r * cols; }
  const float* row(Index r) const { return values.data() + r * cols; }
};

// a += b, elementwise; the shapes match.
void add_into(Matrix& a, const Matrix& b);

struct Parameter {
  Matrix value, grad, moment1, moment2;
  Parameter(Index rows, Index cols);
};

// y = x W + b with W [in, out], initialised as PyTorch's nn.Linear: uniform within
// +-1/sqrt(in).
struct Linear {
  Parameter weight, bias;
  Linear(Index in, Index out, ToyRandom& rng);
  Matrix forward(const Matrix& x) const;
  // dW += x^T dy, db += the column sums of dy, dx += dy W^T.
  void backward(const Matrix& x, const Matrix& dy, Matrix& dx);
};

// Each row normalised to mean 0 and variance 1 (epsilon 1e-5), then scaled and shifted.
struct LayerNorm {
  struct Saved {
    Matrix normalised;
    std::vector<float> inverse_deviation;  // per row
  };
  Parameter gain, bias;
  explicit LayerNorm(Index dim);
  Matrix forward(const Matrix& x, Saved& saved) const;
  void backward(const Saved& saved, const Matrix& dy, Matrix& dx);
};

Matrix relu(const Matrix& x);
// dx += dy where y = relu(x) is positive.
void relu_backward(const Matrix& y, const Matrix& dy, Matrix& dx);

// Rows of a table, initialised from N(0, 1) as nn.Embedding.
struct Embedding {
  Parameter table;
  Embedding(Index words, Index dim, ToyRandom& rng);
  Matrix forward(const std::vector<int>& ids) const;
  void backward(const std::vector<int>& ids, const Matrix& dy);
};

// The mean over rows of -log softmax(logits)[target]; dlogits gets its gradient.
double cross_entropy(const Matrix& logits, const std::vector<int>& targets, Matrix& dlogits);

// Adam (Kingma and Ba) with PyTorch's defaults but the learning rate; zeroes the gradients
// after each step.
class Adam {
 public:
  Adam(std::vector<Parameter*> parameters, float learning_rate);
  void step();

 private:
  std::vector<Parameter*> parameters_;
  float learning_rate_;
  int steps_ = 0;
};

}  // namespace attn::tools
