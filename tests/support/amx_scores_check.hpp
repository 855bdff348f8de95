// The case list of the scores kernels on AMX tiles (src/cpu/amx/scores.hpp for bf16,
// src/cpu/amx/fp16_parts.hpp for fp16) and their check against float64; each test lays out its
// own inputs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::testing {

constexpr float kScoresGuard = -1.5e38f;  // a value the kernels never write

struct ScoresCase {
  Index dim = 64, keys = 1, padding = 0;
  int vectors = 1;
  Index rows() const { return 16 * vectors; }
  Index stride() const { return rows() + padding; }
  std::string name() const {
    return "dim " + std::to_string(dim) + " keys " + std::to_string(keys) + " vectors " +
           std::to_string(vectors) + " padding " + std::to_string(padding);
  }
};

// Each of `dims`, key counts around the blocks of 16 and 32, 1 to 3 row vectors, with and
// without padding rows.
inline std::vector<ScoresCase> score_cases(std::initializer_list<Index> dims) {
  std::vector<ScoresCase> cases;
  for (const Index dim : dims) {
    for (const Index keys : {1, 15, 16, 17, 31, 32, 33, 47, 128}) {
      for (const int vectors : {1, 2, 3}) {
        cases.push_back({dim, keys, keys % 2 == 1 ? Index{5} : Index{0}, vectors});
      }
    }
  }
  return cases;
}

// [keys][stride] floats and 64 guards after them, all kScoresGuard.
inline std::vector<float> guarded_scores(const ScoresCase& c) {
  return std::vector<float>(static_cast<std::size_t>(c.keys * c.stride() + 64), kScoresGuard);
}

// out ([keys][stride], guarded_scores) against scale * k . q in float64 (q: [rows][dim], k:
// [keys][dim], the values the kernel read): padding rows and guards unwritten; where float64's
// score is not finite, the same NaN or infinity; else within products_per_d x dim ulps of
// the sum of |products| (float32 sums of that many exact products per d), NMSE < 1e-12.
inline void expect_scores_match_float64(const ScoresCase& c, const std::vector<double>& q,
                                        const std::vector<double>& k, double scale,
                                        int products_per_d, const std::vector<float>& out) {
  double error = 0, norm = 0;
  for (Index j = 0; j < c.keys; ++j) {
    for (Index r = 0; r < c.stride(); ++r) {
      const float got = out[static_cast<std::size_t>(j * c.stride() + r)];
      if (r >= c.rows()) {
        ASSERT_EQ(got, kScoresGuard) << "padding row " << r << " written at key " << j;
        continue;
      }
      double want = 0, magnitude = 0;
      for (Index d = 0; d < c.dim; ++d) {
        const double product = k[j * c.dim + d] * q[r * c.dim + d];
        want += product;
        magnitude += std::abs(product);
      }
      want *= scale;
      if (!std::isfinite(want)) {
        ASSERT_EQ(std::isnan(got), std::isnan(want)) << "key " << j << " row " << r;
        if (std::isinf(want)) {
          ASSERT_EQ(got, want) << "key " << j << " row " << r;
        }
        continue;
      }
      const double bound = products_per_d * static_cast<double>(c.dim) *
                           std::numeric_limits<float>::epsilon() * scale * magnitude;
      ASSERT_LE(std::abs(got - want), bound) << "key " << j << " row " << r;
      error += (got - want) * (got - want);
      norm += want * want;
    }
  }
  for (std::size_t i = static_cast<std::size_t>(c.keys * c.stride()); i < out.size(); ++i) {
    ASSERT_EQ(out[i], kScoresGuard) << "guard " << i << " after the scores written";
  }
  if (norm > 0) {
    EXPECT_LT(error / norm, 1e-12);
  }
}

}  // namespace attn::testing
