// attn::State: the attention monoid (docs/architecture.md), public. For each query row and
// head it holds m (largest visible score), l (sum of exp(s - m)) and acc (sum of
// exp(s - m) v) over some set of keys; states over disjoint key sets merge exactly, and
// finalize turns a state into the context and log-sum-exp. Users combine attention over
// parts held separately (a prefix and a suffix, two caches, two machines) by merging
// their states.
#pragma once

#include <vector>

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

// m, l: [B, Hq, Lq, 1]  acc: [B, Hq, Lq, Dv], all of one dtype: float32, or float64 when
// the state was computed from float64 inputs (so float64 users keep float64 precision).
// The empty state (no visible key) is m = -inf, l = 0, acc = 0.
// Sinks are not part of a state: a sink is one extra logit per row, and a merge of two
// states that each held it would count it twice. Pass sinks to finalize instead.
struct State {
  Tensor m;
  Tensor l;
  Tensor acc;

  // The empty state of the given shape; dtype f32 or f64.
  static State empty(DType dtype, Index batch, Index heads, Index rows, Index dim_v);
  DType dtype() const { return acc.dtype(); }
};

// The state over the union of a's and b's keys (which must be disjoint):
//   m = max(m_a, m_b);  l = l_a e^(m_a - m) + l_b e^(m_b - m);  acc likewise.
// Merging with an empty state gives the other state bit for bit. a and b: same shapes and
// dtype, else attn::Error naming the argument.
State merge(const State& a, const State& b);

struct Finalized {
  Tensor context;  // [B, Hq, Lq, Dv]: acc / l, or 0 where l = 0
  Tensor lse;      // [B, Hq, Lq, 1]: m + log l, or -inf where l = 0
};

// sinks: empty or [Hq], finite or -inf: one extra logit per head that takes weight and
// carries no value, added here once (see State). The result has the state's dtype.
Finalized finalize(const State& state, const std::vector<float>& sinks = {});

// Attention of q over k and v as a state rather than a context: forward with the same
// options, except that sinks are refused (give them to finalize). The state is rebuilt
// from forward's context C and lse as m = lse, l = 1, acc = C (l = 0, acc = 0 where no key
// is visible), which represents the same monoid element: finalize gives back C and lse.
// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]
State forward_state(const TensorView& q, const TensorView& k, const TensorView& v,
                    const Options& options = {});

}  // namespace attn
