// Entry points for the emulator (tests/python/emulator.py): one extern "C" function per
// leaf kernel, taking its arguments as one struct in memory, so that the harness sets a
// single register (rdi) and needs no knowledge of the calling convention's float registers.
#include <cstdint>

#include "cpu/amx/kernels.hpp"
#include "cpu/bf16_dot.hpp"

namespace {

// The arguments of attn::cpu::scores_rows_bf16, in its order; laid out as the harness packs
// them (struct format "<QqQqqqfiQ").
struct ScoresRowsBf16Args {
  const std::uint16_t* q_pairs;
  attn::Index rows_stride;
  const std::uint16_t* keys;
  attn::Index key_stride;
  attn::Index key_count;
  attn::Index dim;
  float scale;
  int vectors;
  float* out;
};

// The arguments of attn::cpu::context_rows_bf16, in its order (struct format "<QqqQqqi4xQq":
// the int padded to the next pointer).
struct ContextRowsBf16Args {
  const std::uint16_t* values_t;
  attn::Index values_stride;
  attn::Index dims;
  const std::uint32_t* weight_pairs;
  attn::Index rows_stride;
  attn::Index span;
  int vectors;
  float* out_t;
  attn::Index out_stride;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) void emulated_scores_rows_bf16(
    const ScoresRowsBf16Args* a) {
  attn::cpu::scores_rows_bf16(a->q_pairs, a->rows_stride, a->keys, a->key_stride, a->key_count,
                              a->dim, a->scale, a->vectors, a->out);
}

extern "C" __attribute__((visibility("default"))) void emulated_context_rows_bf16(
    const ContextRowsBf16Args* a) {
  attn::cpu::context_rows_bf16(a->values_t, a->values_stride, a->dims, a->weight_pairs,
                               a->rows_stride, a->span, a->vectors, a->out_t, a->out_stride);
}
