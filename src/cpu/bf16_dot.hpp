// S^T = K Q^T on bfloat16 q and k by AVX512-BF16's dot-product instruction (vdpbf16ps):
// pairs of bf16 along d are multiplied exactly and added into float32 lanes, two
// multiply-adds per lane and instruction where the float32 path does one. The bf16 twin of
// tile::scores_rows_vectorised (src/cpu/tile/), lanes being 16 query rows; compiled
// once, for x86-64, and called only where has_bf16_dot() says the CPU runs it.
#pragma once

#include <cstdint>

#include "attn/half.hpp"
#include "attn/tensor.hpp"
#include "core/problem.hpp"
#include "cpu/amx/scores.hpp"
#include "cpu/amx/tiles.hpp"

namespace attn::cpu {

// Does this CPU run AVX512-BF16 (its OS saving AVX-512 state)?
bool has_bf16_dot();

// Whether a kernel compiled for an AVX-512 target (`avx512`) scores this problem's q and k
// by bf16 dot products: bf16 q and k, an even head dim, a CPU that has them. Forward and the
// weights pass ask this once each, so that both score a row the same way, to the same bits.
inline bool scores_by_bf16_dot(const core::Problem& p, bool avx512) {
  return avx512 && p.q.dtype == DType::bf16 && p.k.dtype == DType::bf16 && p.dim_qk % 2 == 0 &&
         has_bf16_dot();
}

// Whether a kernel compiled for an AVX-512 target scores this problem's fp16 q and k on AMX
// tiles as exact bf16 parts (cpu/amx/fp16_parts.hpp): head dims up to 128 in steps of 16, K's
// parts in bounds, a CPU with AMX. Forward and the weights pass ask this once each, as they
// ask the one above.
inline bool scores_by_fp16_parts(const core::Problem& p, bool avx512) {
  return avx512 && p.q.dtype == DType::f16 && p.k.dtype == DType::f16 &&
         amx_scores_fit(2 * p.dim_qk) &&
         4 * p.batch * p.heads_kv * p.total_k * p.dim_qk <= kAmxPackedMaxBytes && has_amx();
}

// Query rows as the dot instruction pairs them: [d / 2][rows_stride][2] bf16 bits, q[row]
// at rows_stride rows per pair of d (dim even).
constexpr Index kBf16RowsPerVector = 16;

// Puts the bf16 row q (dim elements) at row `row` of that layout: element d at
// ((d / 2) * rows_stride + row) * 2 + d % 2.
inline void put_query_pairs(const bfloat16* q, Index dim, Index row, Index rows_stride,
                            std::uint16_t* pairs) {
  for (Index d = 0; d < dim; ++d) pairs[((d / 2) * rows_stride + row) * 2 + d % 2] = q[d].bits;
}

// out[k][row] = scale * sum_d keys[k][d] q[row][d] for key_count keys (bf16 rows of dim,
// dim even, key_stride elements apart) and `vectors` (1 to 3) vectors of 16 rows from
// q_pairs (laid out as above, at the first row); out: [key_count][rows_stride] floats at the
// first row. On AMX tiles where the CPU has them and amx_scores_fit(dim) (cpu/amx/scores.hpp),
// else by vdpbf16ps; either way each score sums its products in the same order whatever the
// other arguments, so a row scored in any call gets the same bits.
void scores_rows_bf16(const std::uint16_t* q_pairs, Index rows_stride, const std::uint16_t* keys,
                      Index key_stride, Index key_count, Index dim, float scale, int vectors,
                      float* out);

}  // namespace attn::cpu
