// The state merge and the end of a row (docs/architecture.md, "The state merge"): the one
// scalar rule every kernel, attn::merge and attn::finalize use, in plain C++ so that
// src/api includes it without Highway.
#pragma once

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
