// The shared tile core of the fast kernels (forward, weights, decode, backward): every
// policy that decides a result is written here once, and each kernel file keeps only its
// planning, packing and tile walk (docs/architecture.md, "The shared tile core").
//   - the state merge and the end of a row (target-independent, below);
//   - the query rule: scale * q in float32 (scaled_query);
//   - the score shaper: int8 dequantisation, softcap, ALiBi, the visible range, the mask,
//     each in float32 in that order (ScoreShaping, shape_scores, mask_scores);
//   - the online softmax: a NaN-keeping max, one step rule, exp (MaxOfScores,
//     softmax_step);
//   - micro-kernels named by the layout they serve: rows-vectorised (query rows across
//     lanes, keys broadcast), keys-vectorised (keys across lanes, a query broadcast), and
//     dot (query and key rows dotted along d);
//   - one scratch allocator and one OpenMP loop over independent work items.
// The target-independent part is compiled once; the rest per Highway target (include this
// header after foreach_target.h, as Highway's own -inl.h files).
#ifndef ATTN_CPU_TILE_INL_H_ONCE
#define ATTN_CPU_TILE_INL_H_ONCE

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/tensor.hpp"

namespace attn::cpu {

// The larger of two running maxima; NaN when either is NaN, so that a NaN score the row
// sees makes the row NaN, as in the reference (std::max(x, NaN) would drop it).
template <class T>
T merged_max(T a, T b) {
  return std::isnan(a) || std::isnan(b) ? a + b : std::max(a, b);
}

// The weight e^(m_part - m) of a part in a merge: 0 for an empty part, whose -inf - -inf
// would otherwise be NaN.
template <class T>
T part_weight(T m_part, T m) {
  return m_part == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(m_part - m);
}

// The state merge (docs/architecture.md): (m, l, acc) becomes the state over its keys and
// those of (m_b, l_b, acc_b):
//   m = max(m, m_b);  l = l e^(m_old - m) + l_b e^(m_b - m);  acc likewise.
// Merging in an empty part (m_b = -inf, l_b = 0, acc_b = 0) changes no bit.
template <class T>
void merge_state(T& m, T& l, T* acc, T m_b, T l_b, const T* acc_b, Index dim_v) {
  const T merged = merged_max(m, m_b);
  const T w = part_weight(m, merged), w_b = part_weight(m_b, merged);
  l = l * w + l_b * w_b;
  for (Index d = 0; d < dim_v; ++d) acc[d] = acc[d] * w + acc_b[d] * w_b;
  m = merged;
}

// The end of a row: C = acc * inverse_l and lse = m + log l. A row that saw no key
// (l = 0) gives C = 0 and lse = -inf; a NaN row (l is NaN) gives NaN for both.
template <class T>
struct RowEnd {
  T inverse_l;
  double lse;
};

template <class T>
RowEnd<T> end_of_row(T m, T l) {
  if (l == T(0)) return {T(0), -std::numeric_limits<double>::infinity()};
  return {T(1) / l, static_cast<double>(m) + std::log(static_cast<double>(l))};
}

// How a row's scores become its weights once its lse is known: alpha = exp(s - lse),
// computed as exp(s - shift) * factor with shift = lse rounded to float and factor =
// e^(shift - lse) in double, so that the rounding of the shift costs no accuracy. A row
// that saw no key (lse = -inf) gets shift 0 and factor 0: every weight 0.
struct WeightScale {
  float shift, factor;
};

inline WeightScale weight_scale_of_lse(double lse) {
  if (lse == -std::numeric_limits<double>::infinity()) return {0.0f, 0.0f};
  const auto shift = static_cast<float>(lse);
  return {shift, static_cast<float>(std::exp(static_cast<double>(shift) - lse))};
}

}  // namespace attn::cpu

#endif  // ATTN_CPU_TILE_INL_H_ONCE

#if defined(ATTN_CPU_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_INL_H_
#undef ATTN_CPU_TILE_INL_H_
#else
#define ATTN_CPU_TILE_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <cstdint>
#include <type_traits>

#include "attn/half.hpp"
#include "core/mask.hpp"

#include <hwy/contrib/math/math-inl.h>
#include "cpu/to_floats-inl.h"
#include "cpu/vector_exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

inline constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// Vector registers a micro-kernel may fill with accumulators and operands before it spills:
// 16 on SSE4 and AVX2, 32 on AVX-512 (and on Arm's NEON and SVE).
inline constexpr int kVectorRegisters = HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3 ? 16 : 32;

// An x86 AVX-512 target: where forward and the weights pass may score bf16 by AVX512-BF16
// dot products (cpu/bf16_dot.hpp).
inline constexpr bool kAvx512Target = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3;

inline Index lanes() {
  return static_cast<Index>(hn::Lanes(DF()));
}

// ---- Scratch and the thread loop -------------------------------------------------------

// A per-thread buffer of `count` elements: 64-byte aligned and padded to whole cache lines,
// so that threads never share a line.
template <class T>
hwy::AlignedFreeUniquePtr<T[]> scratch_buffer(Index count) {
  constexpr Index kLine = 64, kSize = sizeof(T);
  const Index bytes = (std::max<Index>(count, 1) * kSize + kLine - 1) / kLine * kLine;
  return hwy::AllocateAligned<T>(static_cast<std::size_t>((bytes + kSize - 1) / kSize));
}

// Threads worth starting for `items` work items: no more than there are items.
inline int threads_for(Index items, int threads) {
  return static_cast<int>(std::max<Index>(1, std::min<Index>(threads, items)));
}

// Runs worker(i) for every item i in [0, count) on `threads` threads, each with a worker
// made once by make_worker(thread). Items are independent and each is computed whole by
// one thread, so the thread count changes who computes an item, never its bits.
template <class MakeWorker>
void run_items(Index count, int threads, MakeWorker&& make_worker) {
  const auto items = static_cast<std::int64_t>(count);
#pragma omp parallel num_threads(threads)
  {
    auto worker = make_worker(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < items; ++i) worker(static_cast<Index>(i));
  }
}

// ---- Queries and stored rows -----------------------------------------------------------

// out[0 .. dim) = scale * q in float32: q widened exactly, then one float multiply. Every
// kernel scales q this way, so equal inputs give equal scores.
template <class T>
void scaled_query(const T* HWY_RESTRICT q, Index dim, float scale, float* HWY_RESTRICT out) {
  if constexpr (std::is_same_v<T, float>) {
    for (Index d = 0; d < dim; ++d) out[d] = scale * q[d];  // one pass: no copy to widen
  } else {
    to_floats(q, dim, out);
    for (Index d = 0; d < dim; ++d) out[d] = scale * out[d];
  }
}

// One vector of a stored row (float, float16, bfloat16 or int8) as float32; exact.
template <class T>
HWY_INLINE VF load_floats(DF df, const T* HWY_RESTRICT row) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, row);
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    const hn::Rebind<std::int32_t, DF> di;
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(hn::Rebind<std::int8_t, DF>(), row)));
  } else {
    return load_widened(df, row);
  }
}

template <class T>
HWY_INLINE float load_float(const T* row, Index d) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return to_float(row[d]);
  } else {
    return static_cast<float>(row[d]);
  }
}

// ---- The score shaper ------------------------------------------------------------------

// What turns q.k into a score, beyond the scale already in q. Built once per problem.
struct ScoreShaping {
  ScoreShaping(double softcap_value, bool has_alibi)
      : softcap(softcap_value > 0.0),
        alibi(has_alibi),
        cap(static_cast<float>(softcap_value)),
        inverse_cap(softcap ? static_cast<float>(1.0 / softcap_value) : 0.0f) {}

  bool softcap, alibi;
  float cap, inverse_cap;
};

// One vector of scores, shaped in float32 in this order: the int8 key scale (kDequantise),
// softcap (cap tanh(x * (1 / cap))), ALiBi (- slope |position - key|), then -inf for keys outside
// [first, end) (kHide). Lanes are whatever the layout puts there: rows-vectorised kernels
// pass a broadcast key and per-row position, slope and range; keys-vectorised ones pass
// per-lane keys and a broadcast row. The backward pass passes `derivative`, which gets
// d score / d x (the softcap's 1 - tanh^2, from the same tanh; 1 without softcap).
template <bool kDequantise, bool kHide>
HWY_INLINE VF shape_scores(const ScoreShaping& shaping, VF x, VF key_scale, VI key, VI position,
                           VF slope, VI first, VI end, VF* derivative = nullptr) {
  const DF df;
  if constexpr (kDequantise) x = hn::Mul(x, key_scale);
  if (shaping.softcap) {
    const VF t = hn::Tanh(df, hn::Mul(x, hn::Set(df, shaping.inverse_cap)));
    x = hn::Mul(hn::Set(df, shaping.cap), t);
    if (derivative != nullptr) *derivative = hn::NegMulAdd(t, t, hn::Set(df, 1.0f));
  } else if (derivative != nullptr) {
    *derivative = hn::Set(df, 1.0f);
  }
  if (shaping.alibi) {
    const VF distance = hn::Abs(hn::ConvertTo(df, hn::Sub(position, key)));
    x = hn::NegMulAdd(slope, distance, x);
  }
  if constexpr (kHide) {
    const auto shown = hn::AndNot(hn::Lt(key, first), hn::Lt(key, end));
    x = hn::IfThenElse(hn::RebindMask(df, shown), x, hn::Set(df, kMinusInfinity));
  }
  return x;
}

// shape_scores for keys that need no int8 dequantisation.
template <bool kHide>
HWY_INLINE VF shape_scores(const ScoreShaping& shaping, VF x, VI key, VI position, VF slope,
                           VI first, VI end, VF* derivative = nullptr) {
  return shape_scores<false, kHide>(shaping, x, hn::Set(DF(), 1.0f), key, position, slope, first,
                                    end, derivative);
}

// The mask of one row over keys [first, end): scores[(j - first) * stride] for key j; the
// row of mask elements starts at key 0 (core/mask.hpp says what an element does).
template <class M>
void mask_scores(const M* mask_row, Index first, Index end, float* scores, Index stride) {
  for (Index j = first; j < end; ++j) {
    float& s = scores[(j - first) * stride];
    s = core::masked_score(s, mask_row[j]);
  }
}

// ---- The online softmax ----------------------------------------------------------------

// The running maximum of score vectors, lane by lane, that keeps NaN: hn::Max may drop a
// NaN operand (x86 returns its second operand), so NaN lanes are tracked beside it.
class MaxOfScores {
 public:
  explicit MaxOfScores(VF start) : max_(start), nan_(hn::IsNaN(start)) {}

  HWY_INLINE void add(VF scores) {
    max_ = hn::Max(max_, scores);
    nan_ = hn::Or(nan_, hn::IsNaN(scores));
  }
  // Per lane: the max, or NaN where a NaN was seen.
  VF lanes() const {
    const DF df;
    return hn::IfThenElse(nan_, hn::Set(df, std::numeric_limits<float>::quiet_NaN()), max_);
  }
  // Over all lanes: the max, or NaN if any lane saw one.
  float all() const {
    const DF df;
    if (!hn::AllFalse(df, nan_)) return std::numeric_limits<float>::quiet_NaN();
    return hn::GetLane(hn::MaxOfLanes(df, max_));
  }

 private:
  VF max_;
  hn::Mask<DF> nan_;
};

// One online-softmax step per lane's row: from the old max and the new one (the old max
// merged with the tile's scores by MaxOfScores), the shift subtracted before exp and the
// factor e^(m_old - m_new) that rescales the row's l and acc. Nothing visible yet: the
// shift is 0, so exp(-inf - 0) = 0, not NaN. A NaN max makes the shift, the factor and so
// l and acc NaN: the row reports NaN, never "no key" (the state merge's rule, per tile).
struct SoftmaxStep {
  VF shift, rescale;
};

HWY_INLINE SoftmaxStep softmax_step(DF df, VF old_max, VF new_max) {
  const VF shift = hn::IfThenZeroElse(hn::Eq(new_max, hn::Set(df, kMinusInfinity)), new_max);
  return {shift, VectorExp(df, hn::Sub(old_max, shift))};
}

// The step for one row held as scalars: new max (old max merged with the tile's), shift
// and rescale.
struct RowStep {
  float max, shift, rescale;
};

HWY_INLINE RowStep softmax_step(float old_max, float tile_max) {
  const DF df;
  const float new_max = merged_max(old_max, tile_max);
  // The vector step gives exactly these (VectorExp(0) is 1): a short cut for small tiles.
  if (new_max == old_max && new_max != kMinusInfinity) return {new_max, new_max, 1.0f};
  const SoftmaxStep step = softmax_step(df, hn::Set(df, old_max), hn::Set(df, new_max));
  return {new_max, hn::GetLane(step.shift), hn::GetLane(step.rescale)};
}

// The softmax weight of a shaped score: exp(s - shift).
HWY_INLINE VF softmax_weight(DF df, VF score, VF shift) {
  return VectorExp(df, hn::Sub(score, shift));
}

// The weight of a shaped score under its row's WeightScale: exp(s - shift) * factor, and
// exactly 0 for a hidden key (-inf), whatever the shift.
HWY_INLINE VF weight_of_score(DF df, VF score, VF shift, VF factor) {
  return hn::IfThenZeroElse(hn::Eq(score, hn::Set(df, kMinusInfinity)),
                            hn::Mul(softmax_weight(df, score, shift), factor));
}

// out[0 .. count) = the weights of one row's scores s[0 .. count) (weight_of_score);
// neither needs alignment, and the last count % lanes go through a vector of scratch.
inline void weights_of_scores(const float* HWY_RESTRICT s, Index count, WeightScale scale,
                              float* HWY_RESTRICT out) {
  const DF df;
  const Index n = lanes(), whole = count - count % n;
  const VF shift = hn::Set(df, scale.shift), factor = hn::Set(df, scale.factor);
  for (Index i = 0; i < whole; i += n) {
    hn::StoreU(weight_of_score(df, hn::LoadU(df, s + i), shift, factor), df, out + i);
  }
  if (whole == count) return;
  HWY_ALIGN float last[hn::MaxLanes(DF())];
  std::copy(s + whole, s + count, last);
  std::fill(last + (count - whole), last + n, 0.0f);
  hn::Store(weight_of_score(df, hn::Load(df, last), shift, factor), df, last);
  std::copy(last, last + (count - whole), out + whole);
}

// The backward pass's shift for a row: its weights are exp(s - lse) from the forward's lse
// (softmax_weight with this shift), not from a running max. A row that saw no key (lse =
// -inf) gets +inf, so every weight is exp(-inf) = 0 rather than NaN.
inline float lse_shift(float lse) {
  return lse == kMinusInfinity ? std::numeric_limits<float>::infinity() : lse;
}

// The online softmax over one vector of rows (lanes are rows) and keys [0, keys) of the
// tile, scores at p[j * stride]: the scores become the weights exp(s - shift) in place;
// the rows' m and l (vectors at m, l) are updated, and the factor that rescales their acc
// is left at rescale.
HWY_INLINE void online_softmax_rows(float* HWY_RESTRICT p, Index keys, Index stride,
                                    float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                                    float* HWY_RESTRICT rescale) {
  const DF df;
  const VF old_max = hn::Load(df, m);
  MaxOfScores max(old_max);
  for (Index j = 0; j < keys; ++j) max.add(hn::Load(df, p + j * stride));
  const VF new_max = max.lanes();
  const SoftmaxStep step = softmax_step(df, old_max, new_max);
  VF sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  Index j = 0;
  for (; j + 2 <= keys; j += 2) {
    const VF p0 = softmax_weight(df, hn::Load(df, p + j * stride), step.shift);
    const VF p1 = softmax_weight(df, hn::Load(df, p + (j + 1) * stride), step.shift);
    hn::Store(p0, df, p + j * stride);
    hn::Store(p1, df, p + (j + 1) * stride);
    sum0 = hn::Add(sum0, p0);
    sum1 = hn::Add(sum1, p1);
  }
  if (j < keys) {
    const VF p0 = softmax_weight(df, hn::Load(df, p + j * stride), step.shift);
    hn::Store(p0, df, p + j * stride);
    sum0 = hn::Add(sum0, p0);
  }
  hn::Store(hn::MulAdd(hn::Load(df, l), step.rescale, hn::Add(sum0, sum1)), df, l);
  hn::Store(new_max, df, m);
  hn::Store(step.rescale, df, rescale);
}

// The online softmax over one row's scores (lanes are keys): `vectors` whole vectors at s,
// hidden and padding lanes already -inf. Updates the row's m and l (float, or double for
// a sum that must stay exact over many tiles); with kStore the scores become the weights
// exp(s - shift) in place. Returns the factor that rescales the row's acc, and the tile's
// largest score (-inf: the tile gives the row no weight).
struct RowUpdate {
  float rescale, tile_max;
};

template <bool kStore, class Sum>
HWY_INLINE RowUpdate online_softmax_keys(float* HWY_RESTRICT s, Index vectors, float& m, Sum& l) {
  const DF df;
  const Index n = lanes();
  MaxOfScores max(hn::Set(df, kMinusInfinity));
  for (Index v = 0; v < vectors; ++v) max.add(hn::Load(df, s + v * n));
  const float tile_max = max.all();
  const RowStep step = softmax_step(m, tile_max);
  const VF shift = hn::Set(df, step.shift);
  VF sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  Index v = 0;
  for (; v + 2 <= vectors; v += 2) {
    const VF p0 = softmax_weight(df, hn::Load(df, s + v * n), shift);
    const VF p1 = softmax_weight(df, hn::Load(df, s + (v + 1) * n), shift);
    if constexpr (kStore) {
      hn::Store(p0, df, s + v * n);
      hn::Store(p1, df, s + (v + 1) * n);
    }
    sum0 = hn::Add(sum0, p0);
    sum1 = hn::Add(sum1, p1);
  }
  if (v < vectors) {
    const VF p0 = softmax_weight(df, hn::Load(df, s + v * n), shift);
    if constexpr (kStore) hn::Store(p0, df, s + v * n);
    sum0 = hn::Add(sum0, p0);
  }
  const float tile_sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
  l = std::fma(l, static_cast<Sum>(step.rescale), static_cast<Sum>(tile_sum));
  m = step.max;
  return {step.rescale, tile_max};
}

// ---- Micro-kernels: rows-vectorised (lanes are query rows) ------------------------------

// The FMA loops of the rows- and keys-vectorised kernels are unrolled by 4 (HWY_UNROLL):
// GCC leaves them rolled, and rolled they ran far below the FMA peak on Zen 3 (figures in
// bench/README.md); the order of the FMAs, and so every bit, is the same.

// S^T[key k][row] = sum_d K[k][d] Qt[d][row] for kKeys keys and C row vectors. Its bf16
// twin on AVX512-BF16 is cpu/bf16_dot.cpp (intrinsics: this Highway has no op for it).
// qt: [dim][rows_stride] (at the block's first row)  keys: kKeys row pointers
// out: [kKeys][rows_stride]. Each score is one FMA chain over d in order.
template <int kDim, int C, int kKeys>
HWY_INLINE void scores_rows_vectorised(const float* HWY_RESTRICT qt, Index rows_stride,
                                       const float* const* keys, Index runtime_dim,
                                       float* HWY_RESTRICT out) {
  const DF df;
  const Index n = lanes();
  const Index dim = kDim > 0 ? kDim : runtime_dim;
  VF acc[kKeys][C];
  for (int k = 0; k < kKeys; ++k)
    for (int c = 0; c < C; ++c) acc[k][c] = hn::Zero(df);
  HWY_UNROLL(4) for (Index d = 0; d < dim; ++d) {
    VF q[C];
    for (int c = 0; c < C; ++c) q[c] = hn::Load(df, qt + d * rows_stride + c * n);
    for (int k = 0; k < kKeys; ++k) {
      const VF key = hn::Set(df, keys[k][d]);
      for (int c = 0; c < C; ++c) acc[k][c] = hn::MulAdd(q[c], key, acc[k][c]);
    }
  }
  for (int k = 0; k < kKeys; ++k)
    for (int c = 0; c < C; ++c) hn::Store(acc[k][c], df, out + k * rows_stride + c * n);
}

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
  VF acc[kRows][C];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Load(df, o + r * o_stride + c * n);
    if (rescale == nullptr) continue;
    const VF factor = hn::Set(df, rescale[r]);
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Mul(acc[r][c], factor);
  }
  HWY_UNROLL(4) for (Index j = 0; j < keys; ++j) {
    VF value[C];
    for (int c = 0; c < C; ++c) value[c] = hn::LoadU(df, v + j * v_stride + c * n);
    for (int r = 0; r < kRows; ++r) {
      const VF weight = hn::Set(df, p[j * key_stride + r * row_stride]);
      for (int c = 0; c < C; ++c) acc[r][c] = hn::MulAdd(weight, value[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < C; ++c) hn::Store(acc[r][c], df, o + r * o_stride + c * n);
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
  VF acc[kRows][C];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
  HWY_UNROLL(4) for (Index d = 0; d < dim; ++d) {
    VF key[C];
    for (int c = 0; c < C; ++c) key[c] = hn::LoadU(df, kt + d * kt_stride + c * n);
    for (int r = 0; r < kRows; ++r) {
      const VF query = hn::Set(df, q[r * q_stride + d]);
      for (int c = 0; c < C; ++c) acc[r][c] = hn::MulAdd(query, key[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < C; ++c) hn::Store(acc[r][c], df, out + r * out_stride + c * n);
}

// ---- Micro-kernels: dot (query and key rows dotted along d) -----------------------------

#if HWY_TARGET != HWY_SCALAR
// out4[0 .. 4) = the sums over the 128-bit blocks of a 4-lane-per-block vector.
template <class D>
HWY_INLINE void store_block_sums(D d, hn::Vec<D> v, float* out4) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    store_block_sums(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out4);
  } else {
    hn::StoreU(v, d, out4);
  }
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
// q: NR rows of [dim] float  keys: kDotKeys<NR> rows of [dim] T (repeat the last key of a
// short block)  scores: NR rows of kDotKeys<NR> floats
template <class T, int NR>
HWY_INLINE void scores_by_dot(const float* const* q, const T* const* keys, Index dim,
                              float* const* scores) {
  const DF df;
  const Index n = lanes();
  constexpr int KK = kDotKeys<NR>;
  VF acc[NR][KK];
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < KK; ++k) acc[r][k] = hn::Zero(df);
  const Index whole = dim - dim % n;
  for (Index d = 0; d < whole; d += n) {
    VF key[KK];
    for (int k = 0; k < KK; ++k) key[k] = load_floats(df, keys[k] + d);
    for (int r = 0; r < NR; ++r) {
      VF qv = hn::LoadU(df, q[r] + d);
      keep_in_register(qv);
      for (int k = 0; k < KK; ++k) acc[r][k] = hn::MulAdd(qv, key[k], acc[r][k]);
    }
  }
  // The NR * KK sums four a tree, in row-major order (zero vectors past the last).
  const auto sum = [&](int i) { return i < NR * KK ? acc[i / KK][i % KK] : hn::Zero(df); };
  for (int i = 0; i < NR * KK; i += 4) {
    alignas(16) float sums[4];
    sums_of_lanes4(df, sum(i), sum(i + 1), sum(i + 2), sum(i + 3), sums);
    for (int j = i; j < std::min(i + 4, NR * KK); ++j) scores[j / KK][j % KK] = sums[j - i];
  }
  if (whole == dim) return;
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < KK; ++k)
      for (Index d = whole; d < dim; ++d)
        scores[r][k] = std::fma(q[r][d], load_float(keys[k], d), scores[r][k]);
}

// acc[r] += sum_{t in [first, end)} p[r][t] values[t] for NR rows (P row-major). The value
// dim goes in chunks of W vectors held in NR * W registers across all keys, so a chunk of
// a value row is read once. With 32 registers, at most 16 accumulators: a row of 128 floats
// (AVX-512) goes in one chunk for up to two rows, in two for three or four. With 16, half
// as wide: 4 rows x 4 vectors spilled on AVX2 (Hq = 32 decode, Zen 3: 18% slower).
template <class T, int NR>
HWY_INLINE void context_by_rows(float* const* acc, const float* const* p, const T* const* values,
                                Index first, Index end, Index dim_v) {
  constexpr int W = (NR <= 2 ? 8 : 4) * kVectorRegisters / 32;
  static_assert(NR * W + W + 1 <= kVectorRegisters, "accumulators, a value chunk, a weight");
  const DF df;
  const Index n = lanes();
  const Index whole = dim_v - dim_v % n;
  Index c = 0;
  for (; c + W * n <= whole; c += W * n) {
    VF a[NR][W];
    for (int r = 0; r < NR; ++r)
      for (int w = 0; w < W; ++w) a[r][w] = hn::LoadU(df, acc[r] + c + w * n);
    for (Index t = first; t < end; ++t) {
      VF v[W];
      for (int w = 0; w < W; ++w) v[w] = load_floats(df, values[t] + c + w * n);
      for (int r = 0; r < NR; ++r) {
        const VF weight = hn::Set(df, p[r][t]);
        for (int w = 0; w < W; ++w) a[r][w] = hn::MulAdd(weight, v[w], a[r][w]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int w = 0; w < W; ++w) hn::StoreU(a[r][w], df, acc[r] + c + w * n);
  }
  for (; c < whole; c += n) {
    VF a[NR];
    for (int r = 0; r < NR; ++r) a[r] = hn::LoadU(df, acc[r] + c);
    for (Index t = first; t < end; ++t) {
      const VF v = load_floats(df, values[t] + c);
      for (int r = 0; r < NR; ++r) a[r] = hn::MulAdd(hn::Set(df, p[r][t]), v, a[r]);
    }
    for (int r = 0; r < NR; ++r) hn::StoreU(a[r], df, acc[r] + c);
  }
  for (Index d = whole; d < dim_v; ++d)
    for (Index t = first; t < end; ++t)
      for (int r = 0; r < NR; ++r)
        acc[r][d] = std::fma(p[r][t], load_float(values[t], d), acc[r][d]);
}

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
