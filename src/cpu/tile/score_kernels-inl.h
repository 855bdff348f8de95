// The score micro-kernels, named by the layout they serve: rows-vectorised (query rows
// across lanes, keys broadcast), keys-vectorised (keys across lanes, a query broadcast) and
// dot (query and key rows dotted along d, for few rows). Which one scores a chunk is the
// plan's choice (cpu/plan/plan.hpp).
#if defined(ATTN_CPU_TILE_SCORE_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_SCORE_KERNELS_INL_H_
#undef ATTN_CPU_TILE_SCORE_KERNELS_INL_H_
#else
#define ATTN_CPU_TILE_SCORE_KERNELS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "attn/tensor.hpp"

#include "cpu/tile/stored_rows-inl.h"
#include "cpu/tile/target-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

// ---- Micro-kernels: rows-vectorised (lanes are query rows) ------------------------------

// The FMA loops of the rows- and keys-vectorised kernels are unrolled by 4 (HWY_UNROLL):
// GCC leaves them rolled, and rolled they ran far below the FMA peak on Zen 3 (figures in
// bench/README.md); the order of the FMAs, and so every bit, is the same.

// S^T[key k][row] = sum_d K[k][d] Qt[d][row] for kKeys keys and C row vectors. Its bf16
// twin on AVX512-BF16 is cpu/bf16_dot.cpp (intrinsics: this Highway has no op for it); the
// plan names which scores a chunk (cpu/plan/plan.hpp).
// qt: [dim][rows_stride] (at the block's first row)  keys: kKeys row pointers
// out: [kKeys][rows_stride]. Each score is one FMA chain over d in order.
template <int kDim, int C, int kKeys>
HWY_INLINE void scores_rows_vectorised(const float* HWY_RESTRICT qt, Index rows_stride,
                                       const float* const* keys, Index runtime_dim,
                                       float* HWY_RESTRICT out) {
  const DF df;
  const Index n = lanes();
  const Index dim = kDim > 0 ? kDim : runtime_dim;
  // acc: kKeys x C, key-major
  with_vectors<kKeys * C>([&](auto) ATTN_INLINE_LAMBDA { return hn::Zero(df); },
                          [&](auto&... acc) ATTN_INLINE_LAMBDA {
                            HWY_UNROLL(4) for (Index d = 0; d < dim; ++d) {
                              const auto load_q = [&](auto c) ATTN_INLINE_LAMBDA {
                                return hn::Load(df, qt + d * rows_stride + c * n);
                              };
                              with_vectors<C>(load_q, [&](auto&... q) ATTN_INLINE_LAMBDA {
                                for_each_index<kKeys>([&](auto k) ATTN_INLINE_LAMBDA {
                                  const VF key = hn::Set(df, keys[k][d]);
                                  for_each_index<C>([&](auto c) ATTN_INLINE_LAMBDA {
                                    VF& a = nth_vector<k * C + c>(acc...);
                                    a = hn::MulAdd(nth_vector<c>(q...), key, a);
                                  });
                                });
                              });
                            }
                            for_each_index<kKeys * C>([&](auto i) ATTN_INLINE_LAMBDA {
                              hn::Store(nth_vector<i>(acc...), df,
                                        out + (i / C) * rows_stride + (i % C) * n);
                            });
                          });
}

// ---- Micro-kernels: keys-vectorised (lanes are keys) ------------------------------------

// S[r][key] = sum_d Q[r][d] K^T[d][key] for kRows rows and C vectors of keys: the same FMA
// chain over d per score as scores_rows_vectorised, so the two layouts give equal bits.
// q: kRows rows of dim, stride q_stride  kt: K^T at the block's first key, stride kt_stride
// (any alignment)  out: S at (first row, first key), stride out_stride
template <int kRows, int C>
HWY_INLINE void scores_keys_vectorised(const float* HWY_RESTRICT q, Index q_stride,
                                       const float* HWY_RESTRICT kt, Index kt_stride, Index dim,
                                       float* HWY_RESTRICT out, Index out_stride) {
  const DF df;
  const Index n = lanes();
  // acc: kRows x C, row-major
  with_vectors<kRows * C>([&](auto) ATTN_INLINE_LAMBDA { return hn::Zero(df); },
                          [&](auto&... acc) ATTN_INLINE_LAMBDA {
                            HWY_UNROLL(4) for (Index d = 0; d < dim; ++d) {
                              const auto load_key = [&](auto c) ATTN_INLINE_LAMBDA {
                                return hn::LoadU(df, kt + d * kt_stride + c * n);
                              };
                              with_vectors<C>(load_key, [&](auto&... key) ATTN_INLINE_LAMBDA {
                                for_each_index<kRows>([&](auto r) ATTN_INLINE_LAMBDA {
                                  const VF query = hn::Set(df, q[r * q_stride + d]);
                                  for_each_index<C>([&](auto c) ATTN_INLINE_LAMBDA {
                                    VF& a = nth_vector<r * C + c>(acc...);
                                    a = hn::MulAdd(query, nth_vector<c>(key...), a);
                                  });
                                });
                              });
                            }
                            for_each_index<kRows * C>([&](auto i) ATTN_INLINE_LAMBDA {
                              hn::Store(nth_vector<i>(acc...), df,
                                        out + (i / C) * out_stride + (i % C) * n);
                            });
                          });
}

// ---- Micro-kernels: dot (query and key rows dotted along d) -----------------------------

#if HWY_TARGET != HWY_SCALAR
// out4[0 .. 4) = the sums over the 128-bit blocks of a 4-lane-per-block vector. The halving
// stops on the vector's lanes at run time: a scalable SVE vector may hold 4 to 64 floats,
// and Highway's MaxLanes of a halved scalable tag is no bound on them (it counts the halving
// twice), so a compile-time stop summed 2 or 1 lanes at 128 and 256 bits.
template <int kHalvingsLeft = hwy::CeilLog2(HWY_MAX_BYTES / 16), class D>
HWY_INLINE void store_block_sums(D d, hn::Vec<D> v, float* out4) {
  if constexpr (kHalvingsLeft > 0) {
    if (hn::Lanes(d) > 4) {
      const hn::Half<D> dh;
      store_block_sums<kHalvingsLeft - 1>(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)),
                                          out4);
      return;
    }
  }
  hn::StoreU(v, d, out4);
}
#endif

// out4 = the lane sums of a, b, c and e through one shuffle tree (interleave pairs, then
// 64-bit halves, then 128-bit blocks): about a quarter of the instructions of four
// SumOfLanes. Every dot score is reduced by this tree, so a key's score does not depend on
// which keys share its block.
HWY_INLINE void sums_of_lanes4(DF df, VF a, VF b, VF c, VF e, float* out4) {
#if HWY_TARGET == HWY_SCALAR
  out4[0] = hn::GetLane(a), out4[1] = hn::GetLane(b), out4[2] = hn::GetLane(c);
  out4[3] = hn::GetLane(e);
  (void)df;
#else
  const VF ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));
  const VF ce = hn::Add(hn::InterleaveLower(df, c, e), hn::InterleaveUpper(df, c, e));
  const hn::Repartition<std::uint64_t, DF> du;
  const auto ab64 = hn::BitCast(du, ab), ce64 = hn::BitCast(du, ce);
  const VF low = hn::BitCast(df, hn::InterleaveLower(du, ab64, ce64));
  const VF high = hn::BitCast(df, hn::InterleaveUpper(du, ab64, ce64));
  store_block_sums(df, hn::Add(low, high), out4);
#endif
}

// Keys a dot block takes for NR rows: four (a shuffle tree per row) while NR rows of four
// accumulators, the four keys and a query vector fit the registers; else two, each tree
// then summing two rows. With 16 registers, four rows of four accumulators spilled, and the
// chains through the stack made grouped-query decode 13-16% slower (Zen 3, Hq = 32).
template <int NR>
inline constexpr int kDotKeys = NR * 4 + 4 + 1 <= kVectorRegisters ? 4 : 2;

// Holds v in a register: GCC folds a loaded vector into each multiply-add that uses it,
// one load per use, and two keys a block then need more loads than the multiply-adds leave
// room for (Zen 3: two 256-bit loads a cycle against 10 loads per 8 multiply-adds).
HWY_INLINE void keep_in_register(VF& v) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  asm("" : "+v"(v.raw));
#else
  (void)v;
#endif
}

// scores[r][k] = q[r] . key[k] for NR rows and kDotKeys<NR> keys: lane-wise FMA chains over
// the whole vectors of d, the shuffle tree, then the last d % lanes products in order.
// q: NR rows of [dim] float  keys: kDotKeys<NR> rows of [dim] (row pointers or GroupedRow;
// repeat the last key of a short block)  scores: NR rows of kDotKeys<NR> floats
template <int NR, class Row>
HWY_INLINE void scores_by_dot(const float* const* q, const Row* keys, Index dim,
                              float* const* scores) {
  const DF df;
  const Index n = lanes();
  constexpr int KK = kDotKeys<NR>;
  // int4 rows are whole blocks of 32 (kRowStepVectors): whole is a multiple of the step.
  constexpr int kStep = kRowStepVectors<Row>;
  const Index whole = dim - dim % n;
  // acc: NR x KK, row-major
  with_vectors<NR * KK>([&](auto) ATTN_INLINE_LAMBDA { return hn::Zero(df); },
                        [&](auto&... acc) ATTN_INLINE_LAMBDA {
                          for (Index d = 0; d < whole; d += kStep * n) {
                            for_each_index<kStep>([&](auto j) ATTN_INLINE_LAMBDA {
                              const auto load_key = [&](auto k) ATTN_INLINE_LAMBDA {
                                return row_floats_at<j>(df, keys[k], d);
                              };
                              with_vectors<KK>(load_key, [&](auto&... key) ATTN_INLINE_LAMBDA {
                                for_each_index<NR>([&](auto r) ATTN_INLINE_LAMBDA {
                                  VF qv = hn::LoadU(df, q[r] + d + j * n);
                                  keep_in_register(qv);
                                  for_each_index<KK>([&](auto k) ATTN_INLINE_LAMBDA {
                                    VF& a = nth_vector<r * KK + k>(acc...);
                                    a = hn::MulAdd(qv, nth_vector<k>(key...), a);
                                  });
                                });
                              });
                            });
                          }
                          // The NR * KK sums four a tree, in row-major order (zero vectors past the
                          // last).
                          const auto sum = [&](auto i) ATTN_INLINE_LAMBDA {
                            if constexpr (i < NR * KK) {
                              return nth_vector<i>(acc...);
                            } else {
                              return hn::Zero(df);
                            }
                          };
                          for_each_index<(NR * KK + 3) / 4>([&](auto tree) ATTN_INLINE_LAMBDA {
                            constexpr int i = tree * 4;
                            alignas(16) float sums[4];
                            sums_of_lanes4(df, sum(std::integral_constant<int, i>()),
                                           sum(std::integral_constant<int, i + 1>()),
                                           sum(std::integral_constant<int, i + 2>()),
                                           sum(std::integral_constant<int, i + 3>()), sums);
                            for (int j = i; j < std::min(i + 4, NR * KK); ++j)
                              scores[j / KK][j % KK] = sums[j - i];
                          });
                        });
  if (whole == dim) return;
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < KK; ++k)
      for (Index d = whole; d < dim; ++d)
        scores[r][k] = std::fma(q[r][d], row_float(keys[k], d), scores[r][k]);
}

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
