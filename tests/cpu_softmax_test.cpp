// The walk's online softmax (src/cpu/tile/softmax-inl.h) with the scale left to it, as AMX
// scores leave S^T unscaled (src/cpu/walk/scorer-inl.h): the bits of scores scaled first, on
// every compiled target this CPU runs, over tiles that raise and keep the rows' max, with
// NaN, infinities, signed zeros and ties; and its weights put straight into the pairs of
// forward's bf16 contexts.
#include <gtest/gtest.h>
#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/amx/context.hpp"
#include "cpu/tile/online_softmax.hpp"
#include "cpu/tile/weight_pairs.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

constexpr Index kRows = 64;  // vectors of every target's rows (2048-bit SVE's 64 lanes)
constexpr Index kKeys = 37;

// Floats on a vector boundary, as the walk's scratch holds them (the softmax loads aligned).
struct Aligned {
  explicit Aligned(const std::vector<float>& values)
      : size(values.size()), data(hwy::AllocateAligned<float>(values.size())) {
    std::copy(values.begin(), values.end(), data.get());
  }
  Aligned(std::size_t n, float value) : Aligned(std::vector<float>(n, value)) {}
  float* get() const { return data.get(); }
  float operator[](std::size_t i) const { return data[i]; }
  std::size_t size;
  hwy::AlignedFreeUniquePtr<float[]> data;
};

bool same_bits(const Aligned& a, const Aligned& b) {
  return a.size == b.size && std::memcmp(a.get(), b.get(), a.size * sizeof(float)) == 0;
}

// Three tiles of scores [key][row]: the second raises some rows' max, the third none; special
// values in a few rows.
std::vector<std::vector<float>> tiles_of_scores() {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<std::vector<float>> tiles(3, std::vector<float>(kKeys * kRows));
  for (std::size_t t = 0; t < tiles.size(); ++t) {
    for (float& s : tiles[t]) s = normal(rng) + (t == 1 ? 3.0f : 0.0f);
  }
  const float inf = std::numeric_limits<float>::infinity();
  tiles[0][5 * kRows + 1] = std::numeric_limits<float>::quiet_NaN();  // row 1: NaN from tile 0
  tiles[1][2 * kRows + 2] = -inf;                                     // a hidden key
  for (Index j = 0; j < kKeys; ++j) tiles[0][j * kRows + 3] = -inf;   // row 3: no key in tile 0
  tiles[2][7 * kRows + 4] = inf;                                      // row 4: +inf late
  tiles[0][kRows + 5] = 0.0f, tiles[0][2 * kRows + 5] = -0.0f;        // row 5: signed zeros
  for (Index j = 0; j < kKeys; ++j) tiles[0][j * kRows + 6] = -0.0f;
  tiles[1][9 * kRows + 7] = tiles[1][3 * kRows + 7] = 30.0f;  // row 7: a tie at the max
  tiles[2][kRows + 8] = 3e38f;                                // row 8: overflows once scaled
  return tiles;
}

TEST(OnlineSoftmax, DeferredScaleGivesTheBitsOfScoresScaledFirst) {
  const std::vector<std::vector<float>> tiles = tiles_of_scores();
  for (const float scale : {0.125f, 0.0883883476f, 1.0f, 3.0f}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    testing::for_each_target([&] {
      const float inf = std::numeric_limits<float>::infinity();
      const Aligned m_scaled(kRows, -inf), l_scaled(kRows, 0.0f), r_scaled(kRows, 0.0f);
      const Aligned m_deferred(kRows, -inf), l_deferred(kRows, 0.0f), r_deferred(kRows, 0.0f);
      for (std::size_t t = 0; t < tiles.size(); ++t) {
        SCOPED_TRACE("tile " + std::to_string(t));
        std::vector<float> scaled_scores = tiles[t];
        for (float& s : scaled_scores) s *= scale;
        const Aligned scaled(scaled_scores), deferred(tiles[t]);
        for (Index r = 0; r < kRows;) {
          const Index rows = cpu::online_softmax_rows_dispatched(
              scaled.get() + r, kKeys, kRows, m_scaled.get() + r, l_scaled.get() + r,
              r_scaled.get() + r, 0.0f);
          ASSERT_EQ(cpu::online_softmax_rows_dispatched(deferred.get() + r, kKeys, kRows,
                                                        m_deferred.get() + r, l_deferred.get() + r,
                                                        r_deferred.get() + r, scale),
                    rows);
          r += rows;
        }
        EXPECT_TRUE(same_bits(deferred, scaled)) << "weights";
        EXPECT_TRUE(same_bits(m_deferred, m_scaled)) << "max";
        EXPECT_TRUE(same_bits(l_deferred, l_scaled)) << "sum";
        EXPECT_TRUE(same_bits(r_deferred, r_scaled)) << "rescale";
      }
      EXPECT_TRUE(std::isnan(m_deferred[1]) && std::isnan(l_deferred[1]));
      EXPECT_TRUE(l_deferred[0] > 0.0f && std::isfinite(l_deferred[0]));
    });
  }
}

// The weights put straight into their pairs (tile::WeightPairSink, forward's bf16 contexts),
// the span's other pairs zeroed (cpu::zero_pairs_outside), are the pairs put_weight_pairs
// lays from the weights stored in place, to the bit, with the same m, l and rescale: for an
// odd and an even number of keys, keys starting inside a span of AMX key blocks, each number
// of parts and a deferred scale; the scores stay as they were.
TEST(OnlineSoftmax, WeightsPutInPairsAreThePairsOfTheWeightsInPlace) {
  struct Span {
    Index first, end, span;
  };
  const std::vector<std::vector<float>> tiles = tiles_of_scores();
  for (const Span at : {Span{0, kKeys, kKeys + 1}, Span{0, kKeys - 1, kKeys - 1},
                        Span{4, kKeys, 64}, Span{2, 34, 64}}) {
    const Index keys = at.end - at.first, plane = at.span / 2 * kRows;
    for (const int parts : {1, 2, 3}) {
      for (const float scale : {0.0f, 0.125f}) {
        SCOPED_TRACE("keys [" + std::to_string(at.first) + ", " + std::to_string(at.end) + ") of " +
                     std::to_string(at.span) + ", parts " + std::to_string(parts) +
                     ", deferred scale " + std::to_string(scale));
        testing::for_each_target([&] {
          const float inf = std::numeric_limits<float>::infinity();
          const Aligned m_in_place(kRows, -inf), l_in_place(kRows, 0.0f), r_in_place(kRows, 0.0f);
          const Aligned m_paired(kRows, -inf), l_paired(kRows, 0.0f), r_paired(kRows, 0.0f);
          for (std::size_t t = 0; t < tiles.size(); ++t) {
            SCOPED_TRACE("tile " + std::to_string(t));
            const Aligned in_place(tiles[t]), scores(tiles[t]);
            std::vector<std::uint32_t> want(parts * plane), got(parts * plane, 0xDEADBEEFu);
            for (Index r = 0; r < kRows;) {
              const Index rows = cpu::online_softmax_rows_dispatched(
                  in_place.get() + r, keys, kRows, m_in_place.get() + r, l_in_place.get() + r,
                  r_in_place.get() + r, scale);
              ASSERT_EQ(cpu::online_softmax_rows_to_pairs_dispatched(
                            scores.get() + r, keys, kRows, m_paired.get() + r, l_paired.get() + r,
                            r_paired.get() + r, scale, got.data() + at.first / 2 * kRows + r, kRows,
                            plane, parts),
                        rows);
              r += rows;
            }
            cpu::zero_pairs_outside(at.first, at.end, at.span, kRows, parts, got.data());
            cpu::put_weight_pairs_dispatched(in_place.get(), kRows, at.first, at.end, at.span,
                                             kRows, parts, want.data());
            EXPECT_EQ(got, want) << "pairs";
            EXPECT_TRUE(same_bits(scores, Aligned(tiles[t]))) << "scores";
            EXPECT_TRUE(same_bits(m_paired, m_in_place)) << "max";
            EXPECT_TRUE(same_bits(l_paired, l_in_place)) << "sum";
            EXPECT_TRUE(same_bits(r_paired, r_in_place)) << "rescale";
          }
        });
      }
    }
  }
}

}  // namespace
}  // namespace attn
