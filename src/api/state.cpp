// The attention state monoid (docs/architecture.md): empty, merge, finalize, and forward as
// a state.
#include "attn/state.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "attn/attention.hpp"
#include "attn/error.hpp"
#include "core/argument_checks.hpp"
#include "cpu/tile/state.hpp"

namespace attn {
namespace {

using core::fail;

void check_state(const char* name, const State& s) {
  if (s.acc.empty() || s.m.empty() || s.l.empty()) fail(name, "a state with m, l and acc", "none");
  const DType dtype = s.acc.dtype();
  if (dtype != DType::f32 && dtype != DType::f64) {
    fail(name, "acc of dtype float32 or float64", dtype_name(dtype));
  }
  const Dims& a = s.acc.shape();
  const Dims rows{a[0], a[1], a[2], 1};
  for (const Tensor* t : {&s.m, &s.l}) {
    const char* part = t == &s.m ? ".m" : ".l";
    if (t->shape() != rows)
      fail(std::string(name) + part, "shape " + format_dims(rows), format_dims(t->shape()));
    if (t->dtype() != dtype)
      fail(std::string(name) + part, std::string("dtype ") + dtype_name(dtype) + " (as acc)",
           dtype_name(t->dtype()));
  }
}

// out = a, then b merged in, row by row (the one state merge of cpu/tile/state.hpp).
template <class T>
void merge_rows(const State& a, const State& b, State& out) {
  const Index rows = a.m.numel(), dim_v = a.acc.shape()[3];
  const T *mb = b.m.data_as<T>(), *lb = b.l.data_as<T>(), *acc_b = b.acc.data_as<T>();
  T *m = out.m.data_as<T>(), *l = out.l.data_as<T>(), *acc = out.acc.data_as<T>();
  std::copy_n(a.m.data_as<T>(), rows, m);
  std::copy_n(a.l.data_as<T>(), rows, l);
  std::copy_n(a.acc.data_as<T>(), rows * dim_v, acc);
  for (Index r = 0; r < rows; ++r) {
    cpu::merge_state(m[r], l[r], acc + r * dim_v, mb[r], lb[r], acc_b + r * dim_v, dim_v);
  }
}

// A sink is a part with one logit and no value (l = 1, acc = 0), merged in before the end
// of the row; both by the rules of cpu/tile/state.hpp.
template <class T>
void finalize_rows(const State& s, const std::vector<float>& sinks, Finalized& out) {
  const Dims& shape = s.acc.shape();
  const Index heads = shape[1], len_q = shape[2], dim_v = shape[3];
  const Index rows = s.m.numel();
  const T *m_in = s.m.data_as<T>(), *l_in = s.l.data_as<T>(), *acc_in = s.acc.data_as<T>();
  T *context = out.context.data_as<T>(), *lse = out.lse.data_as<T>();
  const std::vector<T> no_value(static_cast<std::size_t>(dim_v), T(0));
  for (Index r = 0; r < rows; ++r) {
    T m = m_in[r], l = l_in[r];
    T* acc = context + r * dim_v;
    std::copy_n(acc_in + r * dim_v, dim_v, acc);
    if (!sinks.empty()) {
      const auto sink = static_cast<T>(sinks[static_cast<std::size_t>((r / len_q) % heads)]);
      const T sink_l = sink == -std::numeric_limits<T>::infinity() ? T(0) : T(1);
      cpu::merge_state(m, l, acc, sink, sink_l, no_value.data(), dim_v);
    }
    const cpu::RowEnd<T> end = cpu::end_of_row(m, l);
    lse[r] = static_cast<T>(end.lse);
    for (Index d = 0; d < dim_v; ++d) acc[d] *= end.inverse_l;
  }
}

// m = lse, l = 1, acc = context (l = 0 where lse = -inf: no visible key, context 0).
template <class T>
void state_from_forward(State& s) {
  T *m = s.m.data_as<T>(), *l = s.l.data_as<T>();
  for (Index r = 0; r < s.m.numel(); ++r) {
    l[r] = m[r] == -std::numeric_limits<T>::infinity() ? T(0) : T(1);
  }
}

}  // namespace

State State::empty(DType dtype, Index batch, Index heads, Index rows, Index dim_v) {
  if (dtype != DType::f32 && dtype != DType::f64) {
    fail("dtype", "float32 or float64", dtype_name(dtype));
  }
  State s{Tensor(dtype, {batch, heads, rows, 1}), Tensor(dtype, {batch, heads, rows, 1}),
          Tensor(dtype, {batch, heads, rows, dim_v})};
  const Index count = s.m.numel();
  if (dtype == DType::f32) {
    for (Index r = 0; r < count; ++r) s.m.data_as<float>()[r] = -INFINITY;
  } else {
    for (Index r = 0; r < count; ++r) s.m.data_as<double>()[r] = -INFINITY;
  }
  return s;
}

State merge(const State& a, const State& b) {
  check_state("a", a);
  check_state("b", b);
  if (b.acc.shape() != a.acc.shape()) {
    fail("b", "acc of shape " + format_dims(a.acc.shape()) + " (as a)", format_dims(b.acc.shape()));
  }
  if (b.dtype() != a.dtype()) {
    fail("b", std::string("dtype ") + dtype_name(a.dtype()) + " (as a)", dtype_name(b.dtype()));
  }
  const Dims& shape = a.acc.shape();
  State out = State::empty(a.dtype(), shape[0], shape[1], shape[2], shape[3]);
  if (a.dtype() == DType::f32) {
    merge_rows<float>(a, b, out);
  } else {
    merge_rows<double>(a, b, out);
  }
  return out;
}

Finalized finalize(const State& state, const std::vector<float>& sinks) {
  check_state("state", state);
  const Dims& shape = state.acc.shape();
  core::check_sinks(sinks, shape[1]);
  Finalized out{Tensor(state.dtype(), shape), Tensor(state.dtype(), state.m.shape())};
  if (state.dtype() == DType::f32) {
    finalize_rows<float>(state, sinks, out);
  } else {
    finalize_rows<double>(state, sinks, out);
  }
  return out;
}

State forward_state(const TensorView& q, const TensorView& k, const TensorView& v,
                    const Options& options) {
  if (!options.sinks.empty()) {
    fail("sinks", "none in forward_state (a state excludes sinks; pass them to finalize)",
         std::to_string(options.sinks.size()) + " values");
  }
  const DType dtype = q.dtype == DType::f64 ? DType::f64 : DType::f32;
  // Shapes are checked by forward_into; these only size the outputs it checks against.
  State s{Tensor(dtype, {q.shape[0], q.shape[1], q.shape[2], 1}),
          Tensor(dtype, {q.shape[0], q.shape[1], q.shape[2], 1}),
          Tensor(dtype, {q.shape[0], q.shape[1], q.shape[2], v.shape[3]})};
  forward_into(q, k, v, options, Outputs{s.acc.mutable_view(), s.m.mutable_view(), std::nullopt});
  if (dtype == DType::f32) {
    state_from_forward<float>(s);
  } else {
    state_from_forward<double>(s);
  }
  return s;
}

}  // namespace attn
