// Entry points into the tile core for tests/contraction_test.cpp, compiled once per
// -ffp-contract setting into the namespace ATTN_CONTRACTION_NAMESPACE (tests/CMakeLists.txt).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "contraction/kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attn/half.hpp"
#include "contraction/kernels.hpp"
#include "core/element_type.hpp"

#include "cpu/tile/context_kernels-inl.h"
#include "cpu/tile/score_kernels-inl.h"
#include "cpu/tile/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::testing::ATTN_CONTRACTION_NAMESPACE::HWY_NAMESPACE {
namespace {

namespace tile = cpu::HWY_NAMESPACE::tile;

template <class T>
std::vector<T> stored(const float* x, Index count) {
  std::vector<T> out(static_cast<std::size_t>(count));
  for (Index i = 0; i < count; ++i) out[static_cast<std::size_t>(i)] = core::from_float<T>(x[i]);
  return out;
}

template <int NR, class T>
void dot_scores_of(const float* q, const float* keys, Index dim, float* scores) {
  constexpr int kKeys = tile::kDotKeys<NR>;
  const std::vector<T> k = stored<T>(keys, 4 * dim);
  const float* rows[NR];
  const T* key_rows[kKeys];
  float* out[NR];
  for (int r = 0; r < NR; ++r) rows[r] = q + r * dim, out[r] = scores + r * 4;
  for (int start = 0; start < 4; start += kKeys) {
    for (int i = 0; i < kKeys; ++i) key_rows[i] = k.data() + (start + i) * dim;
    tile::scores_by_dot<NR>(rows, key_rows, dim, out);
    for (int r = 0; r < NR; ++r) out[r] += kKeys;
  }
}

template <int NR, class T>
void context_of(const float* p, const float* values, Index count, Index dim, float* acc) {
  const std::vector<T> v = stored<T>(values, count * dim);
  std::vector<const T*> value_rows(static_cast<std::size_t>(count));
  for (Index t = 0; t < count; ++t) value_rows[static_cast<std::size_t>(t)] = v.data() + t * dim;
  const float* weights[NR];
  float* rows[NR];
  for (int r = 0; r < NR; ++r) weights[r] = p + r * count, rows[r] = acc + r * dim;
  tile::context_by_rows<NR>(rows, weights, value_rows.data(), 0, count, dim);
}

template <class Fn>
void with_rows(int rows, Fn&& fn) {
  switch (rows) {
    case 1:
      return fn(std::integral_constant<int, 1>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    case 3:
      return fn(std::integral_constant<int, 3>{});
    default:
      return fn(std::integral_constant<int, 4>{});
  }
}

}  // namespace

void DotScores(const float* q, const float* keys, DType dtype, Index dim, int rows, float* scores) {
  with_rows(rows, [&](auto nr) {
    core::with_float_type(dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        dot_scores_of<decltype(nr)::value, T>(q, keys, dim, scores);
      }
    });
  });
}

void ContextByRows(const float* p, const float* values, DType dtype, Index count, Index dim,
                   int rows, float* acc) {
  with_rows(rows, [&](auto nr) {
    core::with_float_type(dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, double>) {
        context_of<decltype(nr)::value, T>(p, values, count, dim, acc);
      }
    });
  });
}

void SoftmaxKeys(const float* scores, Index vectors, float* m, float* l) {
  const Index count = vectors * static_cast<Index>(hwy::HWY_NAMESPACE::Lanes(tile::DF()));
  auto aligned = hwy::AllocateAligned<float>(static_cast<std::size_t>(count));
  std::copy(scores, scores + count, aligned.get());
  tile::online_softmax_keys<false>(aligned.get(), vectors, *m, *l);
}

}  // namespace attn::testing::ATTN_CONTRACTION_NAMESPACE::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::testing::ATTN_CONTRACTION_NAMESPACE {

HWY_EXPORT(DotScores);
HWY_EXPORT(ContextByRows);
HWY_EXPORT(SoftmaxKeys);

void dot_scores(const float* q, const float* keys, DType keys_dtype, Index dim, int rows,
                float* scores) {
  HWY_DYNAMIC_DISPATCH(DotScores)(q, keys, keys_dtype, dim, rows, scores);
}

void context_by_rows(const float* p, const float* values, DType values_dtype, Index count,
                     Index dim, int rows, float* acc) {
  HWY_DYNAMIC_DISPATCH(ContextByRows)(p, values, values_dtype, count, dim, rows, acc);
}

void softmax_keys(const float* scores, Index vectors, float* m, float* l) {
  HWY_DYNAMIC_DISPATCH(SoftmaxKeys)(scores, vectors, m, l);
}

}  // namespace attn::testing::ATTN_CONTRACTION_NAMESPACE
#endif
