// Entry point for the emulator (tests/python/emulator.py) into the paged kernel as Highway's
// AVX-512 target compiles it (src/cpu/decode/decode.cpp, this target alone, with the
// runtime of freestanding_runtime.cpp): caller-owned pools in either layout, ragged queries,
// on one thread, with the problem attn::paged_attention would hand the kernel for valid
// arguments (the checks are the native library's, tested there).
#include <hwy/highway.h>

#include <cstdint>
#include <span>

#include "attn/state.hpp"
#include "cpu/decode/decode.hpp"

namespace attn::cpu::HWY_NAMESPACE {
void DecodeTarget(const DecodeProblem& problem, State& state, int threads);
}  // namespace attn::cpu::HWY_NAMESPACE

extern "C" void emulated_runtime_reset();

namespace {

using attn::CacheDType;
using attn::Index;

// q [total_q, Hq, D] float32; key and value pools of `dtype` in `layout` (0: token-major
// [pages, page_size, Hkv, D], 1: head-major [pages, Hkv, page_size, D]) with int8 scales
// [pages, Hkv]; query_start [S + 1], seq_lens [S] and table [S, max_pages] int32; causal, a
// left window and softcap as Options has them. Out: the
// kernel's float32 state rows [Hq, total_q]: m, l and acc (unnormalised, [.., Dv]).
struct PagedArgs {
  const float* q;
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
};

Index element_bytes(CacheDType dtype) {
  return dtype == CacheDType::f32 ? 4 : dtype == CacheDType::int8 ? 1 : 2;
}

attn::cache::PageRows rows_of(const PagedArgs& a, bool values) {
  attn::cache::PageRows rows;
  rows.dtype = static_cast<CacheDType>(a.dtype);
  rows.page_size = a.page_size;
  rows.heads_kv = a.heads_kv;
  rows.dim = values ? a.dim_v : a.dim;
  rows.data = static_cast<std::byte*>(const_cast<void*>(values ? a.values : a.keys));
  rows.scales = values ? a.value_scales : a.key_scales;
  const Index row = rows.dim * element_bytes(rows.dtype);
  rows.page_bytes = a.page_size * a.heads_kv * row;
  rows.slot_bytes = a.layout == 0 ? a.heads_kv * row : row;
  rows.head_bytes = a.layout == 0 ? row : a.page_size * row;
  return rows;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void emulated_paged(const PagedArgs* a) {
  emulated_runtime_reset();
  attn::cpu::DecodeProblem p;
  p.q = a->q;
  p.q_dtype = attn::DType::f32;
  const Index total_q = a->query_start[a->sequences];
  p.q_rows.head_stride = a->dim;
  p.q_rows.token_stride = a->heads_q * a->dim;
  p.state_rows.head_stride = total_q;
  p.state_rows.token_stride = 1;
  p.keys = rows_of(*a, false);
  p.values = rows_of(*a, true);
  p.heads_q = a->heads_q, p.heads_kv = a->heads_kv, p.dim = a->dim, p.dim_v = a->dim_v;
  p.rule.scale = a->scale;
  p.rule.causal = a->causal != 0;
  p.rule.window.left = a->window_left;
  p.rule.softcap = a->softcap;
  p.rule.causal_align = attn::CausalAlign::bottom_right;
  p.threads = 1;
  const std::span<const std::int32_t> table(a->table,
                                            static_cast<std::size_t>(a->sequences * a->max_pages));
  for (Index s = 0; s <= a->sequences; ++s) p.query_start.push_back(a->query_start[s]);
  for (Index s = 0; s < a->sequences; ++s) {
    p.tables.push_back(table.subspan(static_cast<std::size_t>(s * a->max_pages),
                                     static_cast<std::size_t>(a->max_pages)));
    p.lengths.push_back(a->seq_lens[s]);
    p.q_rows.seq_base.push_back(a->query_start[s] * p.q_rows.token_stride);
    p.state_rows.seq_base.push_back(a->query_start[s]);
  }
  // The empty state (m = -inf, l = 0, acc = 0), as State::empty makes it.
  attn::State state{attn::Tensor(attn::DType::f32, {1, a->heads_q, total_q, 1}),
                    attn::Tensor(attn::DType::f32, {1, a->heads_q, total_q, 1}),
                    attn::Tensor(attn::DType::f32, {1, a->heads_q, total_q, a->dim_v})};
  const Index rows = a->heads_q * total_q;
  for (Index i = 0; i < rows; ++i) state.m.data_as<float>()[i] = -__builtin_inff();
  attn::cpu::HWY_NAMESPACE::DecodeTarget(p, state, 1);
  for (Index i = 0; i < rows; ++i) {
    a->m[i] = state.m.data_as<float>()[i];
    a->l[i] = state.l.data_as<float>()[i];
  }
  for (Index i = 0; i < rows * a->dim_v; ++i) a->acc[i] = state.acc.data_as<float>()[i];
}
