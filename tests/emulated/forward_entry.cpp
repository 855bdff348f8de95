// An entry point for the emulator (tests/python/emulator.py) into the forward kernel as
// Highway's AVX-512 target compiles it (src/cpu/forward.cpp, this target alone, with the
// runtime of freestanding_runtime.cpp): the problem of one contiguous batch of q, k and v,
// one segment, on one thread, as attn::forward would plan it.
#include <hwy/highway.h>

#include <cstdint>

#include "attn/attention.hpp"
#include "core/problem.hpp"

namespace attn::cpu::HWY_NAMESPACE {
void ForwardTarget(const core::Problem& problem, int threads);
}  // namespace attn::cpu::HWY_NAMESPACE

extern "C" void emulated_runtime_reset();

namespace {

using attn::Dims;
using attn::DType;
using attn::Index;

// q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] of one dtype; context [B, Hq, Lq,
// Dv] f32, lse [B, Hq, Lq] f32, weights [B, Hq, Lq, Lk] f32 or null.
struct ForwardArgs {
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
};

Dims contiguous(const Dims& shape) {
  return {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void emulated_forward(const ForwardArgs* a) {
  emulated_runtime_reset();
  const auto dtype = static_cast<DType>(a->dtype);
  const Dims q_shape{a->batch, a->heads_q, a->len_q, a->dim};
  const Dims k_shape{a->batch, a->heads_kv, a->len_k, a->dim};
  const Dims v_shape{a->batch, a->heads_kv, a->len_k, a->dim_v};
  const Dims context_shape{a->batch, a->heads_q, a->len_q, a->dim_v};
  const Dims lse_shape{a->batch, a->heads_q, a->len_q, 1};
  const Dims weights_shape{a->batch, a->heads_q, a->len_q, a->len_k};
  attn::core::Problem p;
  p.q = attn::TensorView(a->q, dtype, q_shape, contiguous(q_shape));
  p.k = attn::TensorView(a->k, dtype, k_shape, contiguous(k_shape));
  p.v = attn::TensorView(a->v, dtype, v_shape, contiguous(v_shape));
  p.batch = a->batch, p.heads_q = a->heads_q, p.heads_kv = a->heads_kv;
  p.dim_qk = a->dim, p.dim_v = a->dim_v;
  p.total_q = a->len_q, p.total_k = a->len_k;
  for (Index b = 0; b < a->batch; ++b) p.segments.push_back({b, 0, a->len_q, 0, a->len_k});
  p.scale = a->scale;
  p.causal = a->causal != 0;
  p.outputs.context =
      attn::MutableTensorView(a->context, DType::f32, context_shape, contiguous(context_shape));
  p.outputs.lse = attn::MutableTensorView(a->lse, DType::f32, lse_shape, contiguous(lse_shape));
  if (a->weights != nullptr) {
    p.outputs.weights =
        attn::MutableTensorView(a->weights, DType::f32, weights_shape, contiguous(weights_shape));
  }
  p.threads = 1;
  attn::cpu::HWY_NAMESPACE::ForwardTarget(p, 1);
}
