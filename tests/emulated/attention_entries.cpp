// Entry points for the emulator (tests/python/emulator.py) into the attention kernels as
// Highway's AVX-512 target compiles them (src/cpu/forward/forward.cpp, weights.cpp and
// backward.cpp, this target alone, with the runtime of freestanding_runtime.cpp): the
// problem of one contiguous batch of q, k and v, one segment per batch, on one thread, as
// the library's API would plan it.
#include <hwy/highway.h>

#include <cstdint>

#include "core/backward_problem.hpp"
#include "core/problem.hpp"
#include "core/weight_request.hpp"

namespace attn::cpu::HWY_NAMESPACE {
void ForwardTarget(const core::Problem& problem, int threads);
void WeightsTarget(const core::Problem& problem, const core::WeightRequest& request, int threads);
void BackwardTarget(const core::BackwardProblem& problem, int threads);
}  // namespace attn::cpu::HWY_NAMESPACE

extern "C" void emulated_runtime_reset();

namespace {

using attn::Dims;
using attn::DType;
using attn::Index;
using attn::MutableTensorView;
using attn::TensorView;
namespace target = attn::cpu::HWY_NAMESPACE;

// q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] of one dtype; float32 outputs
// (null where not wanted): context [B, Hq, Lq, Dv], lse [B, Hq, Lq], weights [B, Hq, Lq,
// Lk]; lse64, the float64 lse forward hands the weights pass; for backward, out and dout
// [B, Hq, Lq, Dv] of the inputs' dtype and float32 lse in, float32 dq, dk, dv out; dropout
// for forward and backward alike.
struct AttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  std::int32_t dtype;  // attn::DType
  std::int32_t causal;
  Index batch, heads_q, heads_kv, len_q, len_k, dim, dim_v;
  double scale;
  float* context;
  float* lse;
  float* weights;
  double* lse64;
  const void* out;
  const void* dout;
  float* dq;
  float* dk;
  float* dv;
  double dropout_p;  // Options::dropout_p (0: off) and dropout_seed
  std::uint64_t dropout_seed;
  std::int32_t pv_precision;  // attn::PvPrecision
};

Dims contiguous(const Dims& shape) {
  return {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
}

Dims q_shape(const AttentionArgs& a, Index dim) {
  return {a.batch, a.heads_q, a.len_q, dim};
}
Dims kv_shape(const AttentionArgs& a, Index dim) {
  return {a.batch, a.heads_kv, a.len_k, dim};
}

TensorView input(const void* data, DType dtype, const Dims& shape) {
  return TensorView(data, dtype, shape, contiguous(shape));
}
MutableTensorView output(float* data, const Dims& shape) {
  return MutableTensorView(data, DType::f32, shape, contiguous(shape));
}

attn::core::Problem make_problem(const AttentionArgs& a) {
  emulated_runtime_reset();
  const auto dtype = static_cast<DType>(a.dtype);
  attn::core::Problem p;
  p.q = input(a.q, dtype, q_shape(a, a.dim));
  p.k = input(a.k, dtype, kv_shape(a, a.dim));
  p.v = input(a.v, dtype, kv_shape(a, a.dim_v));
  p.batch = a.batch, p.heads_q = a.heads_q, p.heads_kv = a.heads_kv;
  p.dim_qk = a.dim, p.dim_v = a.dim_v;
  p.total_q = a.len_q, p.total_k = a.len_k;
  for (Index b = 0; b < a.batch; ++b) p.segments.push_back({b, 0, a.len_q, 0, a.len_k});
  p.rule.scale = a.scale;
  p.rule.causal = a.causal != 0;
  p.dropout = attn::core::make_dropout(a.dropout_p, a.dropout_seed);
  p.pv_precision = static_cast<attn::PvPrecision>(a.pv_precision);
  p.threads = 1;
  return p;
}

}  // namespace

// Forward; a float32 weights output it keeps itself, as attn::forward runs it.
extern "C" __attribute__((visibility("default"))) void emulated_forward(const AttentionArgs* a) {
  attn::core::Problem p = make_problem(*a);
  p.outputs.context = output(a->context, q_shape(*a, a->dim_v));
  p.outputs.lse = a->lse64 != nullptr ? MutableTensorView(a->lse64, DType::f64, q_shape(*a, 1),
                                                          contiguous(q_shape(*a, 1)))
                                      : output(a->lse, q_shape(*a, 1));
  if (a->weights != nullptr) p.outputs.weights = output(a->weights, q_shape(*a, a->len_k));
  target::ForwardTarget(p, 1);
}

// The weights pass on its own, or with lse64 (a forward's) its emit walk alone.
extern "C" __attribute__((visibility("default"))) void emulated_weights(const AttentionArgs* a) {
  const attn::core::Problem p = make_problem(*a);
  attn::core::WeightRequest request =
      attn::core::whole_request(p, output(a->weights, q_shape(*a, a->len_k)));
  if (a->lse64 != nullptr) request.lse = input(a->lse64, DType::f64, q_shape(*a, 1));
  target::WeightsTarget(p, request, 1);
}

extern "C" __attribute__((visibility("default"))) void emulated_backward(const AttentionArgs* a) {
  attn::core::BackwardProblem p;
  p.forward = make_problem(*a);
  const auto dtype = static_cast<DType>(a->dtype);
  p.out = input(a->out, dtype, q_shape(*a, a->dim_v));
  p.dout = input(a->dout, dtype, q_shape(*a, a->dim_v));
  p.lse = input(a->lse, DType::f32, q_shape(*a, 1));
  p.dq = output(a->dq, q_shape(*a, a->dim));
  p.dk = output(a->dk, kv_shape(*a, a->dim));
  p.dv = output(a->dv, kv_shape(*a, a->dim_v));
  target::BackwardTarget(p, 1);
}
