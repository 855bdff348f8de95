// Entry point for the emulator (tests/python/emulator.py) into the paged kernel as Highway's
// AVX-512 target compiles it (src/cpu/decode/decode.cpp, this target alone, with the
// runtime of freestanding_runtime.cpp): caller-owned pools in either layout, ragged queries,
// on one thread, its rows placed by api::set_paged_rows as attn::paged_attention places them
// (the checks are the native library's, tested there).
#include <hwy/highway.h>

#include <cstdint>

#include "api/paged_step.hpp"
#include "attn/state.hpp"
#include "cpu/decode/decode.hpp"

namespace attn::cpu::HWY_NAMESPACE {
void DecodeTarget(const DecodeProblem& problem, State& state, int threads);
}  // namespace attn::cpu::HWY_NAMESPACE

extern "C" void emulated_runtime_reset();

namespace {

using attn::CacheDType;
using attn::Index;

// q [total_q, Hq, D] of q_dtype (attn::DType: float32 or bfloat16); a key pool of `dtype`
// and a value pool of `value_dtype` in `layout` (0: token-major [pages, page_size, Hkv, D], 1:
// head-major [pages, Hkv, page_size, D]) with int8 and int4 scales, one per token and KV head in
// the pool's layout (or, with group > 0, one per group of `group` elements of each row; with
// zero_point, (scale, offset) pairs), or fp8 ones, one per KV head (or null); query_start [S + 1],
// seq_lens [S] and table [S, max_pages] int32; causal, a left window, softcap and pv_precision
// (attn::PvPrecision) as Options has them. Out: the kernel's float32 state rows [Hq, total_q]: m, l
// and acc (unnormalised, [.., Dv]).
struct PagedArgs {
  const void* q;
  const void* keys;
  const void* values;
  float* key_scales;
  float* value_scales;
  std::int32_t dtype;  // attn::CacheDType
  std::int32_t layout;
  std::int32_t causal;
  std::int32_t sequences;
  const std::int32_t* query_start;
  const std::int32_t* seq_lens;
  const std::int32_t* table;
  Index max_pages, pages, page_size, heads_q, heads_kv, dim, dim_v;
  Index window_left;  // -1: none
  double scale, softcap;
  float* m;
  float* l;
  float* acc;
  std::int32_t q_dtype;
  std::int32_t pv_precision;
  Index group;
  std::int32_t zero_point;
  std::int32_t value_dtype;  // attn::CacheDType of the value pool (dtype: the same)
};

attn::PagePool pool_of(const PagedArgs& a, bool values) {
  const auto dtype = static_cast<CacheDType>(values ? a.value_dtype : a.dtype);
  // group and zero_point are of the pools of codes.
  const bool codes = dtype == CacheDType::int8 || dtype == CacheDType::int4;
  return {const_cast<void*>(values ? a.values : a.keys),
          dtype,
          a.layout == 0 ? attn::PageLayout::token_major : attn::PageLayout::head_major,
          a.pages,
          a.page_size,
          a.heads_kv,
          values ? a.dim_v : a.dim,
          values ? a.value_scales : a.key_scales,
          codes ? a.group : 0,
          codes && a.zero_point != 0};
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void emulated_paged(const PagedArgs* a) {
  emulated_runtime_reset();
  attn::cpu::DecodeProblem p;
  const Index total_q = a->query_start[a->sequences];
  const attn::Dims q_shape{1, total_q, a->heads_q, a->dim};
  const attn::TensorView q(a->q, static_cast<attn::DType>(a->q_dtype), q_shape,
                           {total_q * a->heads_q * a->dim, a->heads_q * a->dim, a->dim, 1});
  const auto count = [](Index n) { return static_cast<std::size_t>(n); };
  const attn::PagedBatch batch{{a->query_start, count(a->sequences + 1)},
                               {a->seq_lens, count(a->sequences)},
                               {a->table, count(a->sequences * a->max_pages)},
                               a->max_pages};
  attn::api::set_paged_rows(p, q, pool_of(*a, false), pool_of(*a, true), batch);
  p.heads_q = a->heads_q, p.heads_kv = a->heads_kv, p.dim = a->dim, p.dim_v = a->dim_v;
  p.rule.scale = a->scale;
  p.rule.causal = a->causal != 0;
  p.rule.window.left = a->window_left;
  p.rule.softcap = a->softcap;
  p.rule.causal_align = attn::CausalAlign::bottom_right;
  p.threads = 1;
  p.pv_precision = static_cast<attn::PvPrecision>(a->pv_precision);
  attn::State state = attn::State::empty(attn::DType::f32, 1, a->heads_q, total_q, a->dim_v);
  attn::cpu::HWY_NAMESPACE::DecodeTarget(p, state, 1);
  const Index rows = a->heads_q * total_q;
  for (Index i = 0; i < rows; ++i) {
    a->m[i] = state.m.data_as<float>()[i];
    a->l[i] = state.l.data_as<float>()[i];
  }
  for (Index i = 0; i < rows * a->dim_v; ++i) a->acc[i] = state.acc.data_as<float>()[i];
}
