#include "cpu/bf16_dot.hpp"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace attn::cpu {

#if defined(__x86_64__)
namespace {

// One multiply-add per key and row vector on each pair of d: 4 keys x 3 row vectors keep 12
// accumulators in flight, as the float32 micro-kernel does (ForwardTraits::kScoreKeys,
// kScoreRowVectors).
constexpr int kKeys = 4;

template <int C, int K>
__attribute__((target("avx512f,avx512bf16"))) void score_block(const std::uint16_t* q_pairs,
                                                               Index rows_stride,
                                                               const std::uint16_t* keys,
                                                               Index key_stride, Index pairs,
                                                               float scale, float* out) {
  __m512 acc[K][C];
  for (int k = 0; k < K; ++k)
    for (int c = 0; c < C; ++c) acc[k][c] = _mm512_setzero_ps();
  for (Index p = 0; p < pairs; ++p) {
    __m512bh q[C];
    for (int c = 0; c < C; ++c) {
      q[c] = reinterpret_cast<__m512bh>(
          _mm512_loadu_si512(q_pairs + (p * rows_stride + c * kBf16RowsPerVector) * 2));
    }
    for (int k = 0; k < K; ++k) {
      std::int32_t pair = 0;
      std::memcpy(&pair, keys + k * key_stride + 2 * p, sizeof pair);
      const auto key = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      for (int c = 0; c < C; ++c) acc[k][c] = _mm512_dpbf16_ps(acc[k][c], q[c], key);
    }
  }
  const __m512 factor = _mm512_set1_ps(scale);
  for (int k = 0; k < K; ++k)
    for (int c = 0; c < C; ++c) {
      _mm512_storeu_ps(out + k * rows_stride + c * kBf16RowsPerVector,
                       _mm512_mul_ps(acc[k][c], factor));
    }
}

template <int C>
void score_keys(const std::uint16_t* q_pairs, Index rows_stride, const std::uint16_t* keys,
                Index key_stride, Index key_count, Index pairs, float scale, float* out) {
  Index k = 0;
  for (; k + kKeys <= key_count; k += kKeys) {
    score_block<C, kKeys>(q_pairs, rows_stride, keys + k * key_stride, key_stride, pairs, scale,
                          out + k * rows_stride);
  }
  for (; k < key_count; ++k) {
    score_block<C, 1>(q_pairs, rows_stride, keys + k * key_stride, key_stride, pairs, scale,
                      out + k * rows_stride);
  }
}

}  // namespace

bool has_bf16_dot() {
  static const bool supported = __builtin_cpu_supports("avx512bf16");
  return supported;
}

void scores_rows_bf16(const std::uint16_t* q_pairs, Index rows_stride, const std::uint16_t* keys,
                      Index key_stride, Index key_count, Index dim, float scale, int vectors,
                      float* out) {
  const Index pairs = dim / 2;
  if (vectors == 1) {
    return score_keys<1>(q_pairs, rows_stride, keys, key_stride, key_count, pairs, scale, out);
  }
  if (vectors == 2) {
    return score_keys<2>(q_pairs, rows_stride, keys, key_stride, key_count, pairs, scale, out);
  }
  score_keys<3>(q_pairs, rows_stride, keys, key_stride, key_count, pairs, scale, out);
}

#else

// Elsewhere no caller reaches scores_rows_bf16 (forward.cpp calls it on x86 AVX-512 targets
// only), so it is not defined.
bool has_bf16_dot() {
  return false;
}

#endif

}  // namespace attn::cpu
