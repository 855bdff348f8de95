// fp16 q and k scored on AMX's bf16 tiles as exact parts (src/cpu/amx/fp16_parts.hpp): the split
// over every fp16 value, and the scores on the model of the tile instructions
// (support/amx_model.hpp) against float64 over a case list, infinities and NaN included; where
// the CPU has AMX, the same cases on the instructions themselves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "cpu/amx/fp16_parts.hpp"
#include "cpu/amx/kernels.hpp"
#include "cpu/amx/tiles.hpp"
#include "cpu/bf16_dot.hpp"
#include "support/amx_model.hpp"
#include "support/amx_scores_check.hpp"

namespace attn {
namespace {

using testing::ModelTiles;

using testing::ScoresCase;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Each finite fp16 value is high + low exactly, both bf16, low never a bf16 denormal (which
// TDPBF16PS would flush); an infinity or NaN goes whole into high (a NaN whose payload lies in
// its low bits too), with low 0.
TEST(Fp16Parts, SumToEveryFp16ValueExactly) {
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float16 x{static_cast<std::uint16_t>(bits)};
    const float value = to_float(x);
    const cpu::Fp16Parts parts = cpu::fp16_parts(value);
    const float high = cpu::bf16_bits_value(parts.high), low = cpu::bf16_bits_value(parts.low);
    SCOPED_TRACE("fp16 bits " + std::to_string(bits));
    if (!std::isfinite(value)) {
      ASSERT_FALSE(parts.finite);
      ASSERT_EQ(parts.low, 0);
      ASSERT_EQ(std::isnan(high), std::isnan(value));
      if (std::isinf(value)) {
        ASSERT_EQ(high, value);
      }
      continue;
    }
    ASSERT_TRUE(parts.finite);
    ASSERT_EQ(static_cast<double>(high) + static_cast<double>(low), static_cast<double>(value));
    ASSERT_TRUE(low == 0.0f || std::abs(low) >= std::numeric_limits<float>::min());
  }
}

struct Fp16Inputs {
  Index stride = 0;
  std::vector<std::uint16_t> q_parts, key_parts;  // put_query_parts', put_key_parts' layouts
  std::vector<std::uint8_t> rows_finite, keys_finite;
  std::vector<double> q, k;  // the fp16 values, [rows][dim] and [keys][dim]
  float scale = 0.125f;

  void set_query(Index r, Index dim, const std::vector<float16>& row) {
    const std::vector<float> values = widened(row);
    for (Index d = 0; d < dim; ++d) q[r * dim + d] = values[d];
    rows_finite[r] = cpu::put_query_parts(values.data(), dim, r, stride, q_parts.data());
  }
  void set_key(Index j, Index dim, const std::vector<float16>& row) {
    const std::vector<float> values = widened(row);
    for (Index d = 0; d < dim; ++d) k[j * dim + d] = values[d];
    keys_finite[j] = cpu::put_key_parts(values.data(), dim, key_parts.data() + j * 2 * dim);
  }
  static std::vector<float> widened(const std::vector<float16>& row) {
    std::vector<float> values;
    for (const float16 x : row) values.push_back(to_float(x));
    return values;
  }
};

// Normals scaled by 2^-12 to 2^12, so that values reach fp16's subnormals and its top range.
std::vector<float16> random_row(Index dim, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float16> row(static_cast<std::size_t>(dim));
  for (float16& x : row) x = to_float16(std::ldexp(normal(rng), exponent(rng)));
  return row;
}

Fp16Inputs make_inputs(const ScoresCase& c, std::uint32_t seed) {
  Fp16Inputs in;
  in.stride = c.stride();
  std::mt19937 rng(seed);
  in.q_parts.assign(static_cast<std::size_t>(4 * c.dim * c.stride()), 0);
  in.rows_finite.assign(static_cast<std::size_t>(c.stride()), 1);
  in.q.resize(static_cast<std::size_t>(c.rows() * c.dim));
  for (Index r = 0; r < c.rows(); ++r) in.set_query(r, c.dim, random_row(c.dim, rng));
  in.key_parts.resize(static_cast<std::size_t>(c.keys * 2 * c.dim));
  in.keys_finite.resize(static_cast<std::size_t>(c.keys));
  in.k.resize(static_cast<std::size_t>(c.keys * c.dim));
  for (Index j = 0; j < c.keys; ++j) in.set_key(j, c.dim, random_row(c.dim, rng));
  return in;
}

template <class Score>
std::vector<float> run_scores(const ScoresCase& c, const Fp16Inputs& in, Score&& score) {
  std::vector<float> out = testing::guarded_scores(c);
  score(in.q_parts.data(), in.rows_finite.data(), c.stride(), in.key_parts.data(),
        in.keys_finite.data(), c.keys, c.dim, in.scale, c.vectors, out.data());
  return out;
}

std::vector<float> run_on_model(const ScoresCase& c, const Fp16Inputs& in) {
  return run_scores(c, in, [](auto... args) { cpu::fp16_scores_by_amx<ModelTiles>(args...); });
}

// Float32 sums of four exact products per d (testing::expect_scores_match_float64).
void expect_matches_float64(const ScoresCase& c, const Fp16Inputs& in,
                            const std::vector<float>& out) {
  testing::expect_scores_match_float64(c, in.q, in.k, in.scale, 4, out);
}

// Every head dim the tiles take for fp16: 2 dim a multiple of 32, up to 256.
std::vector<ScoresCase> score_cases() {
  return testing::score_cases({16, 32, 48, 64, 96, 128});
}

TEST(Fp16Scores, ModelMatchesFloat64OverTheCaseList) {
  for (const ScoresCase& c : score_cases()) {
    SCOPED_TRACE(c.name());
    const Fp16Inputs in = make_inputs(c, static_cast<std::uint32_t>(c.dim * 1000 + c.keys));
    expect_matches_float64(c, in, run_on_model(c, in));
  }
}

// Both passes over A, 2 x 2 blocks: a product per 16 keys, 16 rows, 16 of d and pass.
TEST(Fp16Scores, ModelRunsTwoPassesOfProducts) {
  struct CountingTiles : ModelTiles {
    static void release() {}  // keeps the count of this call until read below
  };
  const ScoresCase c{128, 47, 0, 3};
  const Fp16Inputs in = make_inputs(c, 5);
  run_scores(c, in, [](auto... args) { cpu::fp16_scores_by_amx<CountingTiles>(args...); });
  EXPECT_EQ(ModelTiles::products(),
            3 /* key blocks */ * 3 /* row vectors */ * 8 /* 2 d / 32 */ * 2 /* passes */);
  ModelTiles::release();
}

// Where a part is 0 against an infinity (q_d = 1 has no low part), a sum of parts would make
// NaN of what the float path makes an infinity: such keys and rows come out as float64 has
// them, +inf, -inf or NaN, and the others stay finite.
template <class Score>
void expect_infinities_and_nan_as_float64(Score&& score) {
  const ScoresCase c{32, 20, 3, 1};
  Fp16Inputs in = make_inputs(c, 9);
  const float16 one = to_float16(1.0f), zero = to_float16(0.0f);
  const float16 inf = to_float16(std::numeric_limits<float>::infinity());
  const float16 minus_inf = to_float16(-std::numeric_limits<float>::infinity());
  const float16 nan_low_payload{static_cast<std::uint16_t>(0x7C01)};
  std::mt19937 rng(13);
  for (Index r = 0; r < c.rows(); ++r) {
    std::vector<float16> row = random_row(c.dim, rng);
    row[4] = one;
    row[5] = r == 7 ? zero : one;
    if (r == 9) row[6] = minus_inf;
    in.set_query(r, c.dim, row);
  }
  std::vector<float16> key = random_row(c.dim, rng);
  key[4] = inf;  // +inf for every row
  in.set_key(2, c.dim, key);
  key[4] = minus_inf;  // -inf, NaN for row 9 (-inf against +inf)
  in.set_key(3, c.dim, key);
  key[4] = one;
  key[5] = inf;  // inf * 0 for row 7
  in.set_key(4, c.dim, key);
  key[5] = nan_low_payload;
  in.set_key(5, c.dim, key);
  expect_matches_float64(c, in, run_scores(c, in, score));
  const std::vector<float> out = run_scores(c, in, score);
  EXPECT_EQ(out[static_cast<std::size_t>(2 * in.stride)], kInfinity);
  EXPECT_EQ(out[static_cast<std::size_t>(3 * in.stride)], -kInfinity);
  EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(4 * in.stride + 7)]));
  EXPECT_TRUE(std::isfinite(out[static_cast<std::size_t>(6 * in.stride)]));
}

TEST(Fp16Scores, ModelGivesInfinitiesAndNanAsFloat64) {
  expect_infinities_and_nan_as_float64(
      [](auto... args) { cpu::fp16_scores_by_amx<ModelTiles>(args...); });
}

TEST(Fp16Scores, HardwareMatchesFloat64) {
  if (!cpu::has_amx()) {
    GTEST_SKIP() << "this CPU has no AMX (or Linux refused its tile data): the AMX path was not "
                    "exercised here; its kernel ran on the model above";
  }
  for (const ScoresCase& c : score_cases()) {
    SCOPED_TRACE(c.name());
    const Fp16Inputs in = make_inputs(c, static_cast<std::uint32_t>(c.dim + c.keys));
    expect_matches_float64(c, in,
                           run_scores(c, in, [](auto... args) { cpu::scores_rows_fp16(args...); }));
  }
  expect_infinities_and_nan_as_float64([](auto... args) { cpu::scores_rows_fp16(args...); });
}

}  // namespace
}  // namespace attn
