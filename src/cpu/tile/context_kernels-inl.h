// The context micro-kernels, O = O * rescale + P V, named by layout: rows-vectorised (P
// broadcast against V rows, any O += A^T B), by rows (P row-major, V rows in place, for few
// rows), the transposed context O^T of the AMX path, and the key-by-key paths that skip a
// weight of 0 so that a hidden NaN or infinity in V never reaches a row.
#if defined(ATTN_CPU_TILE_CONTEXT_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_CONTEXT_KERNELS_INL_H_
#undef ATTN_CPU_TILE_CONTEXT_KERNELS_INL_H_
#else
#define ATTN_CPU_TILE_CONTEXT_KERNELS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

#include "cpu/tile/stored_rows-inl.h"
#include "cpu/tile/target-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

// The width in vectors of the next column block of context_rows_vectorised, `left` vectors
// remaining: the widest blocks, but a remainder of 1 after them becomes 2 + 2, since a
// 1-vector block has too few accumulators to hide the FMA latency.
inline Index context_block_width(Index left, Index widest) {
  return left == widest + 1 && widest > 2 ? widest - 1 : std::min(left, widest);
}

// O[r][:C vectors] = O[r] * rescale[r] + sum_{j < keys} P^T[j][r] V[j] for kRows rows.
// p: P^T at (first key, first row): element (j, r) at p[j * key_stride + r * row_stride]
//    (row_stride 1 for P^T laid out by key; key_stride 1 reads a P laid out by row in place)
// v: V at the first key and the block's first column, stride v_stride
// rescale: kRows factors, or nullptr to add onto O as it is
// o: O at (first row, first column), stride o_stride
template <int C, int kRows>
HWY_INLINE void context_rows_vectorised(const float* HWY_RESTRICT p, Index key_stride,
                                        Index row_stride, const float* HWY_RESTRICT v,
                                        Index v_stride, Index keys,
                                        const float* HWY_RESTRICT rescale, float* HWY_RESTRICT o,
                                        Index o_stride) {
  const DF df;
  const Index n = lanes();
  // acc: kRows x C, row-major
  const auto load_o = [&](auto i) ATTN_INLINE_LAMBDA {
    const VF o_part = hn::Load(df, o + (i / C) * o_stride + (i % C) * n);
    return rescale == nullptr ? o_part : hn::Mul(o_part, hn::Set(df, rescale[i / C]));
  };
  with_vectors<kRows * C>(load_o, [&](auto&... acc) ATTN_INLINE_LAMBDA {
    HWY_UNROLL(4) for (Index j = 0; j < keys; ++j) {
      const auto load_value = [&](auto c) ATTN_INLINE_LAMBDA {
        return hn::LoadU(df, v + j * v_stride + c * n);
      };
      with_vectors<C>(load_value, [&](auto&... value) ATTN_INLINE_LAMBDA {
        for_each_index<kRows>([&](auto r) ATTN_INLINE_LAMBDA {
          const VF weight = hn::Set(df, p[j * key_stride + r * row_stride]);
          for_each_index<C>([&](auto c) ATTN_INLINE_LAMBDA {
            VF& a = nth_vector<r * C + c>(acc...);
            a = hn::MulAdd(weight, nth_vector<c>(value...), a);
          });
        });
      });
    }
    for_each_index<kRows * C>([&](auto i) ATTN_INLINE_LAMBDA {
      hn::Store(nth_vector<i>(acc...), df, o + (i / C) * o_stride + (i % C) * n);
    });
  });
}

// Whether `count` rows of `width` floats (stride apart) hold only finite values.
inline bool rows_finite(const float* HWY_RESTRICT rows, Index count, Index stride, Index width) {
  const DF df;
  const Index n = lanes();
  VF zeros = hn::Zero(df);  // x * 0 is 0 for finite x, NaN for NaN and infinities
  for (Index j = 0; j < count; ++j) {
    const float* row = rows + j * stride;
    Index d = 0;
    for (; d + n <= width; d += n) zeros = hn::MulAdd(hn::LoadU(df, row + d), hn::Zero(df), zeros);
    for (; d < width; ++d) {
      if (!std::isfinite(row[d])) return false;
    }
  }
  return hn::AllTrue(df, hn::Eq(zeros, hn::Zero(df)));
}

// o[0 .. width) *= factor: a row's accumulator rescaled when its running max grows.
inline void rescale_row(float* HWY_RESTRICT o, Index width, float factor) {
  const DF df;
  const Index n = lanes(), whole = width - width % n;
  const VF f = hn::Set(df, factor);
  for (Index d = 0; d < whole; d += n) hn::StoreU(hn::Mul(hn::LoadU(df, o + d), f), df, o + d);
  for (Index d = whole; d < width; ++d) o[d] *= factor;
}

// One row's O = O * rescale + sum_j p[j] V[j], skipping keys of weight 0: a V row holding
// NaN or infinity must not reach rows that do not see its key, where 0 * NaN would.
// p: the row's weights of `keys` keys, stride p_stride  v: V rows, stride v_stride
// o: the row's O, `width` floats (whole vectors)
inline void context_skipping_zero_weights(const float* HWY_RESTRICT p, Index p_stride,
                                          const float* HWY_RESTRICT v, Index v_stride, Index keys,
                                          float rescale, float* HWY_RESTRICT o, Index width) {
  const DF df;
  const Index n = lanes();
  rescale_row(o, width, rescale);
  for (Index j = 0; j < keys; ++j) {
    const float weight = p[j * p_stride];
    if (weight == 0.0f) continue;
    const VF w = hn::Set(df, weight);
    for (Index d = 0; d < width; d += n) {
      hn::Store(hn::MulAdd(w, hn::LoadU(df, v + j * v_stride + d), hn::Load(df, o + d)), df, o + d);
    }
  }
}

// The transposed accumulators of one vector of rows (O^T, the layout of forward's context
// on AMX tiles) rescaled when the rows' running maxima grow: o_t[d][lane] *= rescale[lane]
// for d < dims. o_t: O^T at the vector's first row, stride o_stride.
inline void rescale_columns(float* HWY_RESTRICT o_t, Index o_stride, Index dims,
                            const float* HWY_RESTRICT rescale) {
  const DF df;
  const VF factor = hn::Load(df, rescale);
  for (Index d = 0; d < dims; ++d) {
    float* o = o_t + d * o_stride;
    hn::Store(hn::Mul(hn::Load(df, o), factor), df, o);
  }
}

// context_skipping_zero_weights for one row of O^T (already rescaled), V given as bf16 V^T:
// o_t[d] += sum_j p[j] V^T[d][j], keys of weight 0 skipped.
// p: the row's weights, stride p_stride  values_t: V^T at the first key, stride values_stride
// o_t: the row's column of O^T, stride o_stride
inline void context_skipping_zero_weights_transposed(const float* HWY_RESTRICT p, Index p_stride,
                                                     const bfloat16* HWY_RESTRICT values_t,
                                                     Index values_stride, Index keys,
                                                     float* HWY_RESTRICT o_t, Index o_stride,
                                                     Index dims) {
  for (Index j = 0; j < keys; ++j) {
    const float weight = p[j * p_stride];
    if (weight == 0.0f) continue;
    for (Index d = 0; d < dims; ++d) {
      o_t[d * o_stride] =
          std::fma(weight, to_float(values_t[d * values_stride + j]), o_t[d * o_stride]);
    }
  }
}

// acc[r] += sum_{t in [first, end)} p[r][t] values[t] for NR rows (P row-major; values: row
// pointers or GroupedRow). The value
// dim goes in chunks of W vectors held in NR * W registers across all keys, so a chunk of
// a value row is read once. With 32 registers, at most 16 accumulators: a row of 128 floats
// (AVX-512) goes in one chunk for up to two rows, in two for three or four. With 16, half
// as wide: 4 rows x 4 vectors spilled on AVX2 (Hq = 32 decode, Zen 3: 18% slower).
template <int NR, class Row>
HWY_INLINE void context_by_rows(float* const* acc, const float* const* p, const Row* values,
                                Index first, Index end, Index dim_v) {
  constexpr int W = (NR <= 2 ? 8 : 4) * kVectorRegisters / 32;
  static_assert(NR * W + W + 1 <= kVectorRegisters, "accumulators, a value chunk, a weight");
  const DF df;
  const Index n = lanes();
  const Index whole = dim_v - dim_v % n;
  Index c = 0;
  for (; c + W * n <= whole; c += W * n) {
    // a: NR x W, row-major
    const auto load_acc = [&](auto i) ATTN_INLINE_LAMBDA {
      return hn::LoadU(df, acc[i / W] + c + (i % W) * n);
    };
    with_vectors<NR * W>(load_acc, [&](auto&... a) ATTN_INLINE_LAMBDA {
      for (Index t = first; t < end; ++t) {
        // Chunks of whole int4 blocks (c a multiple of W lanes) read them block by block.
        const auto load_value = [&](auto w) ATTN_INLINE_LAMBDA {
          if constexpr (W % kRowStepVectors<Row> == 0) {
            return row_floats_at<w>(df, values[t], c);
          } else {
            return row_floats(df, values[t], c + w * n);
          }
        };
        with_vectors<W>(load_value, [&](auto&... v) ATTN_INLINE_LAMBDA {
          for_each_index<NR>([&](auto r) ATTN_INLINE_LAMBDA {
            const VF weight = hn::Set(df, p[r][t]);
            for_each_index<W>([&](auto w) ATTN_INLINE_LAMBDA {
              VF& sum = nth_vector<r * W + w>(a...);
              sum = hn::MulAdd(weight, nth_vector<w>(v...), sum);
            });
          });
        });
      }
      for_each_index<NR * W>([&](auto i) ATTN_INLINE_LAMBDA {
        hn::StoreU(nth_vector<i>(a...), df, acc[i / W] + c + (i % W) * n);
      });
    });
  }
  for (; c < whole; c += n) {
    with_vectors<NR>([&](auto r) ATTN_INLINE_LAMBDA { return hn::LoadU(df, acc[r] + c); },
                     [&](auto&... a) ATTN_INLINE_LAMBDA {
                       for (Index t = first; t < end; ++t) {
                         const VF v = row_floats(df, values[t], c);
                         for_each_index<NR>([&](auto r) ATTN_INLINE_LAMBDA {
                           VF& sum = nth_vector<r>(a...);
                           sum = hn::MulAdd(hn::Set(df, p[r][t]), v, sum);
                         });
                       }
                       for_each_index<NR>([&](auto r) ATTN_INLINE_LAMBDA {
                         hn::StoreU(nth_vector<r>(a...), df, acc[r] + c);
                       });
                     });
  }
  for (Index d = whole; d < dim_v; ++d)
    for (Index t = first; t < end; ++t)
      for (int r = 0; r < NR; ++r)
        acc[r][d] = std::fma(p[r][t], row_float(values[t], d), acc[r][d]);
}

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
