// The AMX kernels on the hardware's tiles (HardwareTiles), compiled once for x86-64 and
// called only where has_amx() (cpu/amx/tiles.hpp) says the CPU runs them: bf16 scores,
// fp16 scores from exact bf16 parts, and P V. Which chunk takes them is the plan's choice
// (cpu/plan/plan.hpp). Elsewhere none is defined, and no caller reaches them.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::cpu {

// bf16 scores on tiles: cpu/amx/scores.hpp's scores_by_amx, its arguments and layouts
// (q_pairs as put_query_pairs lays them out, cpu/bf16_dot.hpp), scaled or not.
// amx_scores_fit(dim).
void scores_rows_bf16_on_tiles(const std::uint16_t* q_pairs, Index rows_stride,
                               const std::uint16_t* keys, Index key_stride, Index key_count,
                               Index dim, float scale, int vectors, float* out, bool scaled);

// fp16 scores on tiles: cpu/amx/fp16_parts.hpp's fp16_scores_by_amx, its arguments and
// layouts.
void scores_rows_fp16(const std::uint16_t* q_parts, const std::uint8_t* rows_finite,
                      Index rows_stride, const std::uint16_t* key_parts,
                      const std::uint8_t* keys_finite, Index key_count, Index dim, float scale,
                      int vectors, float* out);

// out_t[d][r] += sum_k P[k][r] V[k][d] on tiles: cpu/amx/context.hpp's context_by_amx, its
// arguments and layouts.
void context_rows_bf16_on_tiles(const std::uint16_t* values_t, Index values_stride,
                                Index value_blocks, const std::uint32_t* parts, int weight_parts,
                                Index rows_stride, Index span, int vectors, float* out_t,
                                Index out_stride, int value_parts, Index value_plane);

}  // namespace attn::cpu
