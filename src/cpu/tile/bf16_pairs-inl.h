// The dot-layout micro-kernels of bf16 rows on AVX512-BF16's vdpbf16ps (two products of
// bf16 pairs added into each float32 lane, exactly multiplied): the twins, for few query
// rows (the paged kernel, forward's narrow chunks), of scores_by_dot (score_kernels-inl.h)
// on bf16 q and K, pairs along d, and of context_by_rows (context_kernels-inl.h) on bf16 V
// with P rounded to bf16, pairs along keys. Compiled on the x86 AVX-512 targets only
// (ATTN_TILE_BF16_DOT), with AVX512-BF16 added to the target's features
// (ATTN_BF16_TARGET); a caller reaches them only where has_bf16_dot() (cpu/bf16_dot.hpp)
// says the CPU runs it, from a function of that target.
#if defined(ATTN_CPU_TILE_BF16_PAIRS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_BF16_PAIRS_INL_H_
#undef ATTN_CPU_TILE_BF16_PAIRS_INL_H_
#else
#define ATTN_CPU_TILE_BF16_PAIRS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

#include "cpu/tile/score_kernels-inl.h"
#include "cpu/tile/target-inl.h"

#undef ATTN_TILE_BF16_DOT
#undef ATTN_BF16_TARGET
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define ATTN_TILE_BF16_DOT 1
// This target's features and AVX512-BF16 (clang takes a function's target attribute in
// place of the target's, so the attribute names both).
#define ATTN_BF16_TARGET __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
#include <immintrin.h>
#else
#define ATTN_TILE_BF16_DOT 0
#define ATTN_BF16_TARGET
#endif

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

// bf16 elements in a vector: a pair per float32 lane.
inline constexpr Index kBf16PerVector = 32;

// dim rounded up to whole vectors of pairs: the bf16 rows the pair kernels read, zero past dim.
inline Index bf16_padded_dim(Index dim) {
  return (dim + kBf16PerVector - 1) / kBf16PerVector * kBf16PerVector;
}

// Keys of one vector of scores_by_packed_keys_bf16.
inline constexpr Index kPackedKeys = 16;

// The uint32 of a tile's keys laid by pack_key_pairs, per key vector: 16 pairs of each
// 32-element chunk of d, a vector each.
inline Index packed_key_words(Index dim) {
  return bf16_padded_dim(dim) / 2 * kPackedKeys;
}

// Where context_by_pairs_bf16 keeps value dim d of a row's accumulator: value dims go in
// blocks of 32, each as vpunpcklwd / vpunpckhwd pair two value rows, 128 bits at a time.
// So position c + 4 b + m holds dim c + 8 b + m and position c + 16 + 4 b + m dim
// c + 8 b + 4 + m (block c, 128-bit lane b < 4, m < 4). On every target, for the code that
// reads the accumulators back.
inline Index paired_position(Index d) {
  const Index c = d - d % kBf16PerVector, in = d % kBf16PerVector;
  return c + (in % 8 < 4 ? 0 : 16) + in / 8 * 4 + in % 4;
}

#if ATTN_TILE_BF16_DOT

// The 32 bf16 of a row from element d, those past `dim` read as zero.
ATTN_BF16_TARGET HWY_INLINE __m512bh load_bf16_pairs(const bfloat16* row, Index d, Index dim) {
  if (d + kBf16PerVector <= dim) return (__m512bh)_mm512_loadu_si512(row + d);
  const auto valid = static_cast<__mmask32>((std::uint64_t{1} << (dim - d)) - 1);
  return (__m512bh)_mm512_maskz_loadu_epi16(valid, row + d);
}

// scores[r][k] = scale * (q[r] . key[k]) for NR rows and kDotKeys<NR> keys, bf16 q and keys
// of any dim: lane-wise vdpbf16ps chains over d (the last pairs past dim zero), the shuffle
// tree of scores_by_dot, then the scale. q: NR rows of [dim] bf16  keys: kDotKeys<NR> rows
// of [dim] bf16 (repeat the last key of a short block)  scores: NR rows of kDotKeys<NR>.
template <int NR>
ATTN_BF16_TARGET HWY_INLINE void scores_by_dot_bf16(const bfloat16* const* q,
                                                    const bfloat16* const* keys, Index dim,
                                                    float scale, float* const* scores) {
  constexpr int KK = kDotKeys<NR>;
  const DF df;
  __m512 acc[NR][KK];
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < KK; ++k) acc[r][k] = _mm512_setzero_ps();
  for (Index d = 0; d < dim; d += kBf16PerVector) {
    __m512bh key[KK];
    for (int k = 0; k < KK; ++k) key[k] = load_bf16_pairs(keys[k], d, dim);
    for (int r = 0; r < NR; ++r) {
      const __m512bh query = load_bf16_pairs(q[r], d, dim);
      for (int k = 0; k < KK; ++k) acc[r][k] = _mm512_dpbf16_ps(acc[r][k], query, key[k]);
    }
  }
  // The NR * KK sums four a tree, in row-major order (zero vectors past the last).
  const auto sum = [&](int i) { return i < NR * KK ? VF{acc[i / KK][i % KK]} : hn::Zero(df); };
  for (int i = 0; i < NR * KK; i += 4) {
    alignas(16) float sums[4];
    sums_of_lanes4(df, sum(i), sum(i + 1), sum(i + 2), sum(i + 3), sums);
    for (int j = i; j < NR * KK && j < i + 4; ++j) scores[j / KK][j % KK] = sums[j - i] * scale;
  }
}

// rows[i][j] to rows[j][i]: a 16 x 16 transpose of 32-bit lanes as four 2 x 2 block
// transposes, blocks of 8, 4, 2 and 1 (vpermt2d: rows i and i + h become [i's lanes
// j & h == 0, (i + h)'s the same] and [i's lanes j & h != 0, (i + h)'s the same]).
ATTN_BF16_TARGET HWY_INLINE void transpose16(__m512i* rows) {
  alignas(64) static constexpr auto kIndices = [] {
    std::array<std::array<std::int32_t, 16>, 8> at{};
    for (int s = 0; s < 4; ++s) {
      const int h = 8 >> s;
      for (int j = 0; j < 16; ++j) {
        at[2 * s][j] = (j & h) == 0 ? j : 16 + j - h;
        at[2 * s + 1][j] = (j & h) == 0 ? j + h : 16 + j;
      }
    }
    return at;
  }();
  for (int s = 0; s < 4; ++s) {
    const int h = 8 >> s;
    const __m512i first = _mm512_load_si512(kIndices[2 * s].data());
    const __m512i second = _mm512_load_si512(kIndices[2 * s + 1].data());
    for (int i = 0; i < 16; ++i) {
      if ((i & h) != 0) continue;
      const __m512i a = rows[i], b = rows[i + h];
      rows[i] = _mm512_permutex2var_epi32(a, first, b);
      rows[i + h] = _mm512_permutex2var_epi32(a, second, b);
    }
  }
}

// Keys [0, count) laid for scores_by_packed_keys_bf16, kPackedKeys at a time (the last key
// repeated to fill the last vector): for key vector v, packed + v * packed_key_words(dim)
// holds, for each chunk c of 32 elements of d and pair l < 16 of it, a vector of the keys'
// pairs (elements 32 c + 2 l and 32 c + 2 l + 1, zero past dim) at (16 c + l) * 16.
ATTN_BF16_TARGET HWY_INLINE void pack_key_pairs(const bfloat16* const* keys, Index count, Index dim,
                                                std::uint32_t* packed) {
  for (Index k = 0; k < count; k += kPackedKeys) {
    for (Index d = 0; d < dim; d += kBf16PerVector) {
      __m512i rows[kPackedKeys];
      for (Index i = 0; i < kPackedKeys; ++i) {
        rows[i] = (__m512i)load_bf16_pairs(keys[std::min(k + i, count - 1)], d, dim);
      }
      transpose16(rows);
      for (Index l = 0; l < kPackedKeys; ++l) {
        _mm512_storeu_si512(packed + (d / 2 + l) * kPackedKeys, rows[l]);
      }
    }
    packed += packed_key_words(dim);
  }
}

// scores_by_dot_bf16's scores, to its bits, of kPackedKeys keys laid by pack_key_pairs (the
// keys in lanes, for many rows of one tile): each lane chain of the dot kernel (pair l of
// every chunk) a vector over the keys, q's pair broadcast, and the shuffle tree's sums in
// its order (per 128-bit block b: (l0 + l2) + (l1 + l3) of lanes 4 b + i, then the blocks
// (b0 + b2) + (b1 + b3)), with no shuffle. q: NR rows of [dim] bf16, zero to a multiple of
// 32  scores: NR rows of kPackedKeys.
template <int NR>
ATTN_BF16_TARGET HWY_INLINE void scores_by_packed_keys_bf16(const bfloat16* const* q,
                                                            const std::uint32_t* packed, Index dim,
                                                            float scale, float* const* scores) {
  const Index chunks = bf16_padded_dim(dim) / kBf16PerVector;
  __m512 even_blocks[NR], odd_blocks[NR];  // blocks 0 (+ 2) and 1 (+ 3)
  for (int b = 0; b < 4; ++b) {
    // The chains of the block's four lanes side by side: 4 NR in flight.
    __m512 chain[4][NR];
    for (int i = 0; i < 4; ++i)
      for (int r = 0; r < NR; ++r) chain[i][r] = _mm512_setzero_ps();
    for (Index c = 0; c < chunks; ++c) {
      for (int i = 0; i < 4; ++i) {
        const Index pair = 16 * c + 4 * b + i;
        const auto key = (__m512bh)_mm512_loadu_si512(packed + pair * kPackedKeys);
        for (int r = 0; r < NR; ++r) {
          std::uint32_t word;
          std::memcpy(&word, q[r] + 2 * pair, sizeof(word));
          const auto query = (__m512bh)_mm512_set1_epi32(static_cast<std::int32_t>(word));
          chain[i][r] = _mm512_dpbf16_ps(chain[i][r], query, key);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      const __m512 block = _mm512_add_ps(_mm512_add_ps(chain[0][r], chain[2][r]),
                                         _mm512_add_ps(chain[1][r], chain[3][r]));
      __m512& sum = b % 2 == 0 ? even_blocks[r] : odd_blocks[r];
      sum = b < 2 ? block : _mm512_add_ps(sum, block);
    }
  }
  for (int r = 0; r < NR; ++r) {
    _mm512_storeu_ps(scores[r], _mm512_mul_ps(_mm512_add_ps(even_blocks[r], odd_blocks[r]),
                                              _mm512_set1_ps(scale)));
  }
}

// Most keys of one context_by_pairs_bf16 call: a tile of forward's walk (WalkTraits).
inline constexpr Index kMostPairedKeys = 256;

// The accumulator order of context_by_pairs_bf16: value dims as they are, or in
// paired_position's order (cheaper: no permutes where the accumulators are loaded and
// stored once per few pairs, as in decode's softmax steps).
enum class PairedOrder : std::uint8_t { natural, paired };

// Value dims [c, c + 32) of a row between natural order (two vectors, dims c .. c + 15 and
// c + 16 .. c + 31) and paired order (paired_position): vpermt2ps on both vectors.
ATTN_BF16_TARGET HWY_INLINE void to_paired(__m512& low, __m512& high) {
  alignas(64) static constexpr std::int32_t kLow[16] = {0,  1,  2,  3,  8,  9,  10, 11,
                                                        16, 17, 18, 19, 24, 25, 26, 27};
  alignas(64) static constexpr std::int32_t kHigh[16] = {4,  5,  6,  7,  12, 13, 14, 15,
                                                         20, 21, 22, 23, 28, 29, 30, 31};
  const __m512 n0 = low, n1 = high;
  low = _mm512_permutex2var_ps(n0, _mm512_load_si512(kLow), n1);
  high = _mm512_permutex2var_ps(n0, _mm512_load_si512(kHigh), n1);
}

// The inverse of to_paired: element d of the natural vectors is paired_position(d).
ATTN_BF16_TARGET HWY_INLINE void to_natural(__m512& low, __m512& high) {
  alignas(64) static constexpr std::int32_t kFirst[16] = {0, 1, 2, 3, 16, 17, 18, 19,
                                                          4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr std::int32_t kSecond[16] = {8,  9,  10, 11, 24, 25, 26, 27,
                                                           12, 13, 14, 15, 28, 29, 30, 31};
  const __m512 lo = low, hi = high;
  low = _mm512_permutex2var_ps(lo, _mm512_load_si512(kFirst), hi);
  high = _mm512_permutex2var_ps(lo, _mm512_load_si512(kSecond), hi);
}

// Value dims [c, c + 32 W) of context_by_pairs_bf16's rows: weight_pairs[r][i] the bf16
// weights of keys 2 i and 2 i + 1, rows[j] key j's value row or nullptr (a zero row).
template <int NR, int W, PairedOrder kOrder>
ATTN_BF16_TARGET HWY_INLINE void context_pairs_block(
    float* const* acc, const std::uint32_t (*weight_pairs)[kMostPairedKeys / 2],
    const bfloat16* const* rows, Index pairs, Index c) {
  __m512 sums[NR][W][2];
  for (int r = 0; r < NR; ++r)
    for (int w = 0; w < W; ++w) {
      float* at = acc[r] + c + w * kBf16PerVector;
      sums[r][w][0] = _mm512_loadu_ps(at);
      sums[r][w][1] = _mm512_loadu_ps(at + 16);
      if constexpr (kOrder == PairedOrder::natural) to_paired(sums[r][w][0], sums[r][w][1]);
    }
  for (Index i = 0; i < pairs; ++i) {
    __m512bh weights[NR];
    for (int r = 0; r < NR; ++r) {
      weights[r] = (__m512bh)_mm512_set1_epi32(static_cast<std::int32_t>(weight_pairs[r][i]));
    }
    const bfloat16 *first = rows[2 * i], *second = rows[2 * i + 1];
    for (int w = 0; w < W; ++w) {
      const Index d = c + w * kBf16PerVector;
      const __m512i a = first == nullptr ? _mm512_setzero_si512() : _mm512_loadu_si512(first + d);
      const __m512i b = second == nullptr ? _mm512_setzero_si512() : _mm512_loadu_si512(second + d);
      const auto low = (__m512bh)_mm512_unpacklo_epi16(a, b);
      const auto high = (__m512bh)_mm512_unpackhi_epi16(a, b);
      for (int r = 0; r < NR; ++r) {
        sums[r][w][0] = _mm512_dpbf16_ps(sums[r][w][0], low, weights[r]);
        sums[r][w][1] = _mm512_dpbf16_ps(sums[r][w][1], high, weights[r]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int w = 0; w < W; ++w) {
      float* at = acc[r] + c + w * kBf16PerVector;
      if constexpr (kOrder == PairedOrder::natural) to_natural(sums[r][w][0], sums[r][w][1]);
      _mm512_storeu_ps(at, sums[r][w][0]);
      _mm512_storeu_ps(at + 16, sums[r][w][1]);
    }
}

// acc[r] += sum over keys t in [first, end) of p[r][t] V[t], P rounded to bf16 (to nearest,
// ties to even), for NR rows: keys go in pairs (origin + 2 i, origin + 2 i + 1), a key
// outside [first, end) taking weight 0 and a zero value row, so that a row's sum is the same
// chain of pairs whatever rows share the call. At most kMostPairedKeys keys from origin;
// dim_v a multiple of 32; acc in kOrder.
template <int NR, PairedOrder kOrder>
ATTN_BF16_TARGET HWY_INLINE void context_by_pairs_bf16(float* const* acc, const float* const* p,
                                                       const bfloat16* const* values, Index origin,
                                                       Index first, Index end, Index dim_v) {
  const Index pair_first = first - (first - origin) % 2;
  const Index pairs = (end - pair_first + 1) / 2;
  // The weights in bf16, two keys per 32-bit word (the first key in the low half), 16 keys
  // at a time.
  alignas(32) std::uint32_t weight_pairs[NR][kMostPairedKeys / 2];
  for (Index group = pair_first; group < end; group += 16) {
    const auto bit = [&](Index t) {
      return t <= group ? 0u : t >= group + 16 ? 0xFFFFu : (1u << (t - group)) - 1;
    };
    const auto visible = static_cast<__mmask16>(bit(end) & ~bit(first));
    for (int r = 0; r < NR; ++r) {
      const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(visible, p[r] + group));
      _mm256_store_si256(reinterpret_cast<__m256i*>(weight_pairs[r] + (group - pair_first) / 2),
                         (__m256i)rounded);
    }
  }
  const bfloat16* rows[kMostPairedKeys];
  for (Index j = 0; j < 2 * pairs; ++j) {
    const Index t = pair_first + j;
    rows[j] = t >= first && t < end ? values[t] : nullptr;
  }
  // W blocks of 32 value dims at a time: NR * W * 2 accumulators, at most 16.
  constexpr int W = NR <= 2 ? 4 : 2;
  Index c = 0;
  for (; c + W * kBf16PerVector <= dim_v; c += W * kBf16PerVector) {
    context_pairs_block<NR, W, kOrder>(acc, weight_pairs, rows, pairs, c);
  }
  for (; c < dim_v; c += kBf16PerVector) {
    context_pairs_block<NR, 1, kOrder>(acc, weight_pairs, rows, pairs, c);
  }
}

#endif  // ATTN_TILE_BF16_DOT

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
