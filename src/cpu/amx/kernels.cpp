#include "cpu/amx/kernels.hpp"

#include "cpu/amx/context.hpp"
#include "cpu/amx/fp16_parts.hpp"
#include "cpu/amx/scores.hpp"
#include "cpu/amx/tiles.hpp"

namespace attn::cpu {

#if defined(__x86_64__)

// Each kernel's scaling pass is compiled for AVX-512 with it (flatten inlines it here).
__attribute__((target("avx512f"), flatten)) void scores_rows_bf16_on_tiles(
    const std::uint16_t* q_pairs, Index rows_stride, const std::uint16_t* keys, Index key_stride,
    Index key_count, Index dim, float scale, int vectors, float* out, bool scaled) {
  scores_by_amx<HardwareTiles>(q_pairs, rows_stride, keys, key_stride, key_count, dim, scale,
                               vectors, out, 1, scaled);
}

__attribute__((target("avx512f"), flatten)) void scores_rows_fp16(
    const std::uint16_t* q_parts, const std::uint8_t* rows_finite, Index rows_stride,
    const std::uint16_t* key_parts, const std::uint8_t* keys_finite, Index key_count, Index dim,
    float scale, int vectors, float* out) {
  fp16_scores_by_amx<HardwareTiles>(q_parts, rows_finite, rows_stride, key_parts, keys_finite,
                                    key_count, dim, scale, vectors, out);
}

void context_rows_bf16_on_tiles(const std::uint16_t* values_t, Index values_stride,
                                Index value_blocks, const std::uint32_t* parts, int weight_parts,
                                Index rows_stride, Index span, int vectors, float* out_t,
                                Index out_stride, int value_parts, Index value_plane) {
  context_by_amx<HardwareTiles>(values_t, values_stride, value_blocks, parts, weight_parts,
                                rows_stride, span, vectors, out_t, out_stride, value_parts,
                                value_plane);
}

#endif

}  // namespace attn::cpu
