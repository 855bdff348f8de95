// Forward's products on AVX512-BF16's dot-product instruction (vdpbf16ps): pairs of bf16 are
// multiplied exactly and added into float32 lanes, two multiply-adds per lane and
// instruction where the float32 path does one. S^T = K Q^T on bfloat16 q and k (pairs along
// d), the bf16 twin of tile::scores_rows_vectorised (src/cpu/tile/); and O^T += V^T P^T on
// bf16 V with P rounded to bf16 (pairs along keys), the twin of the AMX context
// (cpu/amx/context.hpp). Lanes are 16 query rows; compiled once, for x86-64, and called only
// where bf16_dot_pays() says they pay on this CPU.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn::cpu {

// Does this CPU run AVX512-BF16 (its OS saving AVX-512 state)?
bool has_bf16_dot();

// Do bf16 products pay on vdpbf16ps here: the CPU runs it (has_bf16_dot), at least at the
// float32 FMA's rate (bf16_dot_at_fma_rate, cpu/cpu_model.hpp), unless a test chose
// otherwise? Where they do not, bf16 is widened to float32 for the FMAs; AMX tiles do not
// ask.
bool bf16_dot_pays();

// Tests: makes bf16_dot_pays() answer `pays` on a CPU with AVX512-BF16, whatever its model,
// so that both the vdpbf16ps kernels and their float32 twins run on every such CPU; nullopt
// hands the answer back to the model's table.
void set_bf16_dot_pays_for_test(std::optional<bool> pays);

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
// first row. Each score sums its products in the same order whatever the other arguments,
// so a row scored in any call gets the same bits. Its AMX twin, which the plan names where
// the CPU has AMX, is scores_rows_bf16_on_tiles (cpu/amx/kernels.hpp).
void scores_rows_bf16(const std::uint16_t* q_pairs, Index rows_stride, const std::uint16_t* keys,
                      Index key_stride, Index key_count, Index dim, float scale, int vectors,
                      float* out);

// out_t[d][r] += sum over keys k < span of P[k][r] V[k][d], for value dims d < dims (a
// multiple of 16) and `vectors` (1 to 3) vectors of 16 rows: values_t is V^T ([d]
// [values_stride] bf16 at the span's first key), weight_pairs the weights rounded to bf16 in
// pairs of keys as put_weight_parts lays them with one part ([span / 2][rows_stride] uint32:
// key k in the low half, k + 1 in the high), out_t [d][out_stride] floats at the first row.
// span is even. Each row adds its pairs of keys in order, whatever the other arguments.
void context_rows_bf16(const std::uint16_t* values_t, Index values_stride, Index dims,
                       const std::uint32_t* weight_pairs, Index rows_stride, Index span,
                       int vectors, float* out_t, Index out_stride);

}  // namespace attn::cpu
