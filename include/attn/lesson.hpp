// The lesson's three steps, one function each: scores between every query and every key,
// softmax weights, and the context vector as the weighted sum of values. They compute in
// float64; scores and softmax return the dtype of their first argument, context that of
// the values it averages. attn::forward fuses all three.
#pragma once

#include <optional>

#include "attn/tensor.hpp"

namespace attn {

enum class ScoreKind : std::uint8_t {
  dot,         // q . k
  scaled_dot,  // (q . k) * scale, scale defaulting to 1/sqrt(D)
  general,     // q^T W k (Luong's bilinear score)
  additive,    // w^T tanh(W1 q + W2 k) (Bahdanau)
};

// Every member has an initializer so that designated initializers ({.kind = ...}) compile
// cleanly under -Wextra.
struct ScoreParams {
  ScoreKind kind = ScoreKind::scaled_dot;
  std::optional<double> scale{};                 // scaled_dot only; an error with any other kind
  std::optional<TensorView> weight{};            // general: W [1, 1, Dq, Dk]
  std::optional<TensorView> query_projection{};  // additive: W1 [1, 1, A, Dq]
  std::optional<TensorView> key_projection{};    // additive: W2 [1, 1, A, Dk]
  std::optional<TensorView> energy{};            // additive: w [1, 1, 1, A]
};

// q: [B, Hq, Lq, Dq]  k: [B, Hkv, Lk, Dk] -> [B, Hq, Lq, Lk]. Dq must equal Dk for dot and
// scaled_dot.
Tensor scores(const TensorView& q, const TensorView& k, const ScoreParams& params = {});

// Softmax over the last dim, with the maximum subtracted for stability. -inf scores get
// weight 0; a row that is -inf everywhere gets zeros. NaN and +inf scores are an error.
Tensor softmax(const TensorView& scores);

struct ContextCheck {
  bool enabled = true;  // verify alpha before using it
  // Allowed |row sum - 1| on top of the rounding of alpha's dtype (2^-11 for float16, 2^-8
  // for bfloat16, 2^-24 for float32); an all-zero row (fully masked) passes.
  double tolerance = 1e-5;
};

// alpha: [B, Hq, Lq, Lk]  v: [B, Hkv, Lk, Dv] -> [B, Hq, Lq, Dv], C = sum_j alpha_j v_j.
Tensor context(const TensorView& alpha, const TensorView& v, const ContextCheck& check = {});

}  // namespace attn
