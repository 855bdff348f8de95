#include "cpu/bf16_dot.hpp"

#include <atomic>
#include <cstring>

#include "cpu/cpu_model.hpp"

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
  // A do-while (pairs >= 1: dim is even and positive): with a loop that may not run, GCC
  // kept acc in memory as well, copied to and from the stack at both ends of the loop.
  Index p = 0;
  do {
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
  } while (++p < pairs);
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

// Value dims per block of the context: with 3 row vectors, 24 accumulators, the weights'
// 3 vectors and a value pair in the 32 registers; one row vector takes 16 dims, to keep as
// many products in flight.
template <int C>
constexpr int kContextDims = C == 1 ? 16 : 8;

template <int C>
__attribute__((target("avx512f,avx512bf16"))) void context_block(const std::uint16_t* values_t,
                                                                 Index values_stride,
                                                                 const std::uint32_t* weight_pairs,
                                                                 Index rows_stride, Index pairs,
                                                                 float* out_t, Index out_stride) {
  constexpr int kDims = kContextDims<C>;
  __m512 acc[kDims][C];
  for (int d = 0; d < kDims; ++d)
    for (int c = 0; c < C; ++c) {
      acc[d][c] = _mm512_loadu_ps(out_t + d * out_stride + c * kBf16RowsPerVector);
    }
  // A do-while (pairs >= 1: context_rows_bf16 returns on an empty span), as in score_block.
  Index p = 0;
  do {
    __m512bh w[C];
    for (int c = 0; c < C; ++c) {
      w[c] = reinterpret_cast<__m512bh>(
          _mm512_loadu_si512(weight_pairs + p * rows_stride + c * kBf16RowsPerVector));
    }
    for (int d = 0; d < kDims; ++d) {
      std::int32_t pair = 0;
      std::memcpy(&pair, values_t + d * values_stride + 2 * p, sizeof pair);
      const auto value = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      for (int c = 0; c < C; ++c) acc[d][c] = _mm512_dpbf16_ps(acc[d][c], w[c], value);
    }
  } while (++p < pairs);
  for (int d = 0; d < kDims; ++d)
    for (int c = 0; c < C; ++c) {
      _mm512_storeu_ps(out_t + d * out_stride + c * kBf16RowsPerVector, acc[d][c]);
    }
}

template <int C>
void context_dims(const std::uint16_t* values_t, Index values_stride, Index dims,
                  const std::uint32_t* weight_pairs, Index rows_stride, Index pairs, float* out_t,
                  Index out_stride) {
  for (Index d = 0; d < dims; d += kContextDims<C>) {
    context_block<C>(values_t + d * values_stride, values_stride, weight_pairs, rows_stride, pairs,
                     out_t + d * out_stride, out_stride);
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

void context_rows_bf16(const std::uint16_t* values_t, Index values_stride, Index dims,
                       const std::uint32_t* weight_pairs, Index rows_stride, Index span,
                       int vectors, float* out_t, Index out_stride) {
  const Index pairs = span / 2;
  if (pairs == 0) return;
  if (vectors == 1) {
    return context_dims<1>(values_t, values_stride, dims, weight_pairs, rows_stride, pairs, out_t,
                           out_stride);
  }
  if (vectors == 2) {
    return context_dims<2>(values_t, values_stride, dims, weight_pairs, rows_stride, pairs, out_t,
                           out_stride);
  }
  context_dims<3>(values_t, values_stride, dims, weight_pairs, rows_stride, pairs, out_t,
                  out_stride);
}

#else

// Elsewhere no caller reaches scores_rows_bf16 or context_rows_bf16 (forward.cpp calls them
// on x86 AVX-512 targets only), so they are not defined.
bool has_bf16_dot() {
  return false;
}

#endif

namespace {
// -1: the model's table decides; 0 or 1: a test's choice.
std::atomic<int> bf16_dot_choice{-1};
}  // namespace

bool bf16_dot_pays() {
  if (!has_bf16_dot()) return false;
  const int choice = bf16_dot_choice.load(std::memory_order_relaxed);
  return choice < 0 ? bf16_dot_at_fma_rate() : choice == 1;
}

void set_bf16_dot_pays_for_test(std::optional<bool> pays) {
  bf16_dot_choice.store(pays ? static_cast<int>(*pays) : -1, std::memory_order_relaxed);
}

}  // namespace attn::cpu
