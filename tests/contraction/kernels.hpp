// The tile core's scalar-tailed kernels (the dot scores, the context by rows, the keys
// layout's softmax step), compiled twice by tests/CMakeLists.txt from contraction/kernels.cpp:
// with the library's -ffp-contract=off (namespace contract_off) and with GCC's default
// -ffp-contract=fast (contract_fast). Equal bits from both say that no bit is left to the
// compiler's fusing of a * b + c (tests/contraction_test.cpp).
#pragma once

#include "attn/tensor.hpp"

namespace attn::testing {

// keys_dtype: float32, float16 or bfloat16, the keys (or values) given as float32 and
// stored in that dtype first.
#define ATTN_CONTRACTION_KERNELS(space)                                                         \
  namespace space {                                                                             \
  /* scores[r][k] = q[r] . keys[k] for `rows` (1 to 4) rows of dim and 4 keys */                \
  void dot_scores(const float* q, const float* keys, DType keys_dtype, Index dim, int rows,     \
                  float* scores);                                                               \
  /* acc[r] += sum_t p[r][t] values[t] for `rows` (1 to 4) rows, `count` values of dim */       \
  void context_by_rows(const float* p, const float* values, DType values_dtype, Index count,    \
                       Index dim, int rows, float* acc);                                        \
  /* m, l after one keys-layout softmax step over `vectors` vectors of scores (16 lanes read at \
   * most) */                                                                                   \
  void softmax_keys(const float* scores, Index vectors, float* m, float* l);                    \
  }

ATTN_CONTRACTION_KERNELS(contract_off)
ATTN_CONTRACTION_KERNELS(contract_fast)

#undef ATTN_CONTRACTION_KERNELS

}  // namespace attn::testing
