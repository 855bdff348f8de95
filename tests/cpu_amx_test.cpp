// The AMX scores kernel (src/cpu/amx/scores.hpp) on the model of the tile instructions
// (support/amx_model.hpp), on any CPU, against float64 over a case list; and, where the CPU
// has AMX, the instructions themselves against the model, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/half.hpp"
#include "cpu/amx/context.hpp"
#include "cpu/amx/fp16_parts.hpp"
#include "cpu/amx/kernels.hpp"
#include "cpu/amx/scores.hpp"
#include "cpu/amx/tiles.hpp"
#include "cpu/bf16_dot.hpp"
#include "cpu/tile/weight_pairs.hpp"
#include "support/amx_model.hpp"
#include "support/amx_scores_check.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

using testing::ModelTiles;

using testing::ScoresCase;

constexpr float kGuard = testing::kScoresGuard;
constexpr std::uint16_t kBf16Nan = 0x7FC0;  // between key rows: a read past a row shows
constexpr Index kKeyGap = 6;

struct ScoresInputs {
  Index key_stride = 0;
  std::vector<std::uint16_t> pairs, keys;  // [dim / 2][stride][2]; [keys][key_stride]
  std::vector<double> q, k;                // the bf16 values, [rows][dim] and [keys][dim]
  float scale = 0.125f;
};

ScoresInputs make_inputs(const ScoresCase& c, std::uint32_t seed) {
  ScoresInputs in;
  in.key_stride = c.dim + kKeyGap;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  in.pairs.assign(static_cast<std::size_t>(c.dim * c.stride()), 0);
  in.q.resize(static_cast<std::size_t>(c.rows() * c.dim));
  for (Index r = 0; r < c.rows(); ++r) {
    for (Index d = 0; d < c.dim; ++d) {
      const bfloat16 value = to_bfloat16(normal(rng));
      in.q[r * c.dim + d] = to_float(value);
      in.pairs[((d / 2) * c.stride() + r) * 2 + d % 2] = value.bits;
    }
  }
  in.keys.assign(static_cast<std::size_t>(c.keys * in.key_stride), kBf16Nan);
  in.k.resize(static_cast<std::size_t>(c.keys * c.dim));
  for (Index j = 0; j < c.keys; ++j) {
    for (Index d = 0; d < c.dim; ++d) {
      const bfloat16 value = to_bfloat16(normal(rng));
      in.k[j * c.dim + d] = to_float(value);
      in.keys[j * in.key_stride + d] = value.bits;
    }
  }
  return in;
}

template <class Run>
std::vector<float> run_scores(const ScoresCase& c, const ScoresInputs& in, Run&& run) {
  std::vector<float> out = testing::guarded_scores(c);
  run(in.pairs.data(), c.stride(), in.keys.data(), in.key_stride, c.keys, c.dim, in.scale,
      c.vectors, out.data());
  return out;
}

std::vector<float> run_on_model(const ScoresCase& c, const ScoresInputs& in) {
  return run_scores(c, in, [](auto... args) { cpu::scores_by_amx<ModelTiles>(args...); });
}

// Float32 sums of exact products, one per d (testing::expect_scores_match_float64).
void expect_matches_float64(const ScoresCase& c, const ScoresInputs& in,
                            const std::vector<float>& out) {
  testing::expect_scores_match_float64(c, in.q, in.k, in.scale, 1, out);
}

// Every dim the kernel takes.
std::vector<ScoresCase> score_cases() {
  return testing::score_cases({32, 64, 96, 128, 256});
}

TEST(AmxScores, ModelMatchesFloat64OverTheCaseList) {
  for (const ScoresCase& c : score_cases()) {
    SCOPED_TRACE(c.name());
    const ScoresInputs in = make_inputs(c, static_cast<std::uint32_t>(c.dim * 1000 + c.keys));
    expect_matches_float64(c, in, run_on_model(c, in));
  }
}

// Blocks of 2 x 2 tiles, a product per 16 keys, 16 rows and 32 of d: no tile multiplied twice.
TEST(AmxScores, ModelRunsOneProductPerTileOfWork) {
  struct CountingTiles : ModelTiles {
    static void release() {}  // keeps the count of this call until read below
  };
  const ScoresCase c{128, 47, 0, 3};
  const ScoresInputs in = make_inputs(c, 5);
  run_scores(c, in, [](auto... args) { cpu::scores_by_amx<CountingTiles>(args...); });
  EXPECT_EQ(ModelTiles::products(), 3 /* key blocks */ * 3 /* row vectors */ * 4 /* d / 32 */);
  ModelTiles::release();
}

TEST(AmxScores, NanInAQueryRowStaysInItsColumn) {
  const ScoresCase c{64, 20, 0, 1};
  ScoresInputs in = make_inputs(c, 9);
  in.pairs[((10 / 2) * c.stride() + 3) * 2] = kBf16Nan;  // q[3][10]
  const std::vector<float> out = run_on_model(c, in);
  for (Index j = 0; j < c.keys; ++j) {
    for (Index r = 0; r < c.rows(); ++r) {
      EXPECT_EQ(std::isnan(out[static_cast<std::size_t>(j * c.stride() + r)]), r == 3)
          << "key " << j << " row " << r;
    }
  }
}

// On AMX hardware, scores_rows_bf16 takes the tiles for these dims. The SDM leaves the
// rounding inside a pair to the hardware, so it is held to float64's bounds, not the model's
// bits.
TEST(AmxScores, HardwareMatchesFloat64) {
  if (!cpu::has_amx()) {
    GTEST_SKIP() << "this CPU has no AMX (or Linux refused its tile data): the AMX path was not "
                    "exercised here; its kernel ran on the model above";
  }
  for (const ScoresCase& c : score_cases()) {
    SCOPED_TRACE(c.name());
    const ScoresInputs in = make_inputs(c, static_cast<std::uint32_t>(c.dim + c.keys));
    expect_matches_float64(c, in,
                           run_scores(c, in, [](auto... args) { cpu::scores_rows_bf16(args...); }));
  }
}

// Each weight is the exact sum of its three bf16 parts, each a float with a zero low half.
TEST(AmxContext, WeightPartsSumToTheWeightExactly) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> weights = {0.0f,
                                1.0f,
                                0.5f,
                                1.0f / 3.0f,
                                std::nextafter(1.0f, 0.0f),
                                1e-30f,
                                std::numeric_limits<float>::min()};
  for (int i = 0; i < 10000; ++i) weights.push_back(unit(rng) * std::exp2(-(i % 40)));
  for (const float w : weights) {
    const cpu::WeightParts parts = cpu::weight_parts(w);
    double sum = 0;
    for (const std::uint32_t part : parts.part) {
      ASSERT_EQ(part & 0xFFFFu, 0u) << w;
      sum += static_cast<double>(cpu::float_of(part));
    }
    ASSERT_EQ(sum, static_cast<double>(w)) << w;
  }
  const cpu::WeightParts nan = cpu::weight_parts(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(cpu::float_of(nan.part[0])));
}

// The kernels' vector twin (cpu/tile/weight_pairs-inl.h) gives put_weight_parts' bits on
// every target this CPU runs: one rounded part (ties to even both ways, weights that round
// up to the next binade) and three exact ones, for keys seen from either half of a pair.
TEST(AmxContext, WeightPairsAreWeightPartsBitsOnEveryTarget) {
  constexpr Index kRows = 48, kSpan = 70;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> weights_t(static_cast<std::size_t>(kSpan * kRows));
  for (std::size_t i = 0; i < weights_t.size(); ++i) {
    const float w = unit(rng) * std::exp2(-static_cast<float>(i % 30));
    std::uint32_t bits;
    std::memcpy(&bits, &w, 4);
    // Every fifth a tie below an even or an odd bf16, every seventh all ones below one.
    if (i % 5 == 0) bits = (bits & 0xFFFF0000u) | 0x8000u;
    if (i % 7 == 0) bits |= 0xFFFFu;
    std::memcpy(&weights_t[i], &bits, 4);
  }
  weights_t[3] = 0.0f, weights_t[4] = 1.0f;
  for (const int parts : {1, cpu::kFp16VWeightParts, cpu::kWeightParts}) {
    for (const std::pair<Index, Index>& keys :
         {std::pair<Index, Index>{0, kSpan}, {3, 67}, {4, 41}}) {
      const Index first = keys.first, end = keys.second;  // named: clang 14 captures no bindings
      SCOPED_TRACE(std::to_string(parts) + " parts, keys [" + std::to_string(first) + ", " +
                   std::to_string(end) + ")");
      const std::size_t words = static_cast<std::size_t>(parts * kSpan / 2 * kRows);
      std::vector<std::uint32_t> want(words);
      cpu::put_weight_parts(weights_t.data() + first * kRows, kRows, first, end, kSpan, kRows,
                            kRows, parts, want.data());
      testing::for_each_target([&] {
        std::vector<std::uint32_t> got(words, 0xDEADBEEFu);
        cpu::put_weight_pairs_dispatched(weights_t.data() + first * kRows, kRows, first, end, kSpan,
                                         kRows, parts, got.data());
        EXPECT_EQ(got, want);
      });
    }
  }
}

struct ContextCase {
  Index value_blocks = 1, span = 32, first = 0, end = 32;
  int vectors = 1;
  int value_parts = 1;                   // 2: fp16 V as its two bf16 parts (cpu/amx/fp16_parts.hpp)
  int weight_parts = cpu::kWeightParts;  // 1: P rounded to bf16; 2: for fp16 V (pv_precision bf16)
  std::string name() const {
    return "value dims " + std::to_string(value_blocks * 16) + " span " + std::to_string(span) +
           " keys [" + std::to_string(first) + ", " + std::to_string(end) + ") vectors " +
           std::to_string(vectors) + " value parts " + std::to_string(value_parts) +
           " weight parts " + std::to_string(weight_parts);
  }
};

// A normal value for V, and its parts: bf16 itself, or fp16 and its two bf16 parts.
struct ValueParts {
  double value;
  std::uint16_t part[2];
};
ValueParts value_parts(float x, int parts) {
  if (parts == 1) {
    const bfloat16 value = to_bfloat16(x);
    return {to_float(value), {value.bits, 0}};
  }
  const float value = to_float(to_float16(x));
  const cpu::Fp16Parts split = cpu::fp16_parts(value);
  return {value, {split.high, split.low}};
}

// w >= 0 cut to its leading `bits` significant bits.
double truncated(double w, int bits) {
  if (w == 0.0) return 0.0;
  const int exponent = std::ilogb(w);
  return std::ldexp(std::floor(std::ldexp(w, bits - 1 - exponent)), exponent - bits + 1);
}

// A weight as `parts` bf16 parts carry it: rounded to bf16 (1); its leading 8 bits and the
// leading 8 of what they leave (2); whole (3).
double weight_as_parts(float weight, int parts) {
  if (parts == 1) return to_float(to_bfloat16(weight));
  if (parts == cpu::kWeightParts) return weight;
  const double high = truncated(weight, 8);
  return high + truncated(weight - high, 8);
}

// out_t[d][r] = start + sum over k in [first, end) of P[k][r] V[k][d] by context_by_amx on
// Tiles, checked against float64: NaN first, guards (padding rows of out_t, its rows past the
// value dims), then per element within (3 parts span + 2) ulps of the sum of magnitudes, NMSE.
// V^T holds NaN past the span, P^T NaN outside [first, end): a read of either shows. With one
// weight part, float64 sums P rounded to bf16 (to_bfloat16: to nearest, ties to even); with
// two, each weight's first two parts (weight_as_parts).
template <class Tiles>
void expect_context_matches_float64(const ContextCase& c, std::uint32_t seed) {
  constexpr Index kPadding = 3, kValuesGap = 32;
  const Index rows = 16 * c.vectors, dims = c.value_blocks * 16, out_stride = rows + kPadding;
  const Index values_stride = c.span + kValuesGap;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> weights_t(static_cast<std::size_t>(c.span * rows),
                               std::numeric_limits<float>::quiet_NaN());
  for (Index k = c.first; k < c.end; ++k) {
    for (Index r = 0; r < rows; ++r) weights_t[k * rows + r] = unit(rng);
  }
  const Index value_plane = dims * values_stride;
  std::vector<std::uint16_t> values_t(static_cast<std::size_t>(c.value_parts * value_plane),
                                      kBf16Nan);
  std::vector<double> values(static_cast<std::size_t>(dims * c.span));
  for (Index d = 0; d < dims; ++d) {
    for (Index k = 0; k < c.span; ++k) {
      const ValueParts v = value_parts(normal(rng), c.value_parts);
      values[d * c.span + k] = v.value;
      for (int part = 0; part < c.value_parts; ++part) {
        values_t[part * value_plane + d * values_stride + k] = v.part[part];
      }
    }
  }
  std::vector<float> out(static_cast<std::size_t>((dims + 1) * out_stride), kGuard);
  for (Index d = 0; d < dims; ++d) {
    for (Index r = 0; r < rows; ++r) out[d * out_stride + r] = normal(rng);
  }
  const std::vector<float> start = out;
  std::vector<std::uint32_t> parts(static_cast<std::size_t>(c.weight_parts * c.span / 2 * rows));
  cpu::put_weight_parts(weights_t.data() + c.first * rows, rows, c.first, c.end, c.span, rows, rows,
                        c.weight_parts, parts.data());
  cpu::context_by_amx<Tiles>(values_t.data(), values_stride, c.value_blocks, parts.data(),
                             c.weight_parts, rows, c.span, c.vectors, out.data(), out_stride,
                             c.value_parts, value_plane);
  double error = 0, norm = 0;
  for (Index d = 0; d <= dims; ++d) {
    for (Index r = 0; r < out_stride; ++r) {
      const std::size_t at = static_cast<std::size_t>(d * out_stride + r);
      if (d == dims || r >= rows) {
        ASSERT_EQ(out[at], kGuard) << "guard at value dim " << d << " row " << r;
        continue;
      }
      ASSERT_TRUE(std::isfinite(out[at])) << "value dim " << d << " row " << r;
      double want = start[at], magnitude = std::abs(start[at]);
      for (Index k = c.first; k < c.end; ++k) {
        const float weight = weights_t[k * rows + r];
        const double term = weight_as_parts(weight, c.weight_parts) * values[d * c.span + k];
        want += term;
        magnitude += std::abs(term);
      }
      const double bound = static_cast<double>(3 * c.value_parts * c.span + 2) *
                           std::numeric_limits<float>::epsilon() * magnitude;
      ASSERT_LE(std::abs(out[at] - want), bound) << "value dim " << d << " row " << r;
      error += (out[at] - want) * (out[at] - want);
      norm += want * want;
    }
  }
  EXPECT_LT(error / norm, 1e-12);
}

// Value dims of 1 to 16 tiles (pairs and a lone one), spans of 1 to 4 key blocks with the
// weights' keys starting and ending inside them, 1 to 3 row vectors; bf16 and fp16 V; P exact,
// in two parts and rounded.
std::vector<ContextCase> context_cases() {
  std::vector<ContextCase> cases;
  for (const int weight_parts : {cpu::kWeightParts, cpu::kFp16VWeightParts, 1}) {
    for (const int value_parts : {1, 2}) {
      for (const Index value_blocks : {1, 2, 3, 8, 16}) {
        for (const Index span : {32, 64, 128}) {
          for (const int vectors : {1, 2, 3}) {
            const Index first = (span / 32 + vectors) % 3 * 5;
            cases.push_back({value_blocks, span, first, span - (vectors - 1) * 7, vectors,
                             value_parts, weight_parts});
          }
        }
      }
    }
  }
  return cases;
}

TEST(AmxContext, ModelMatchesFloat64OverTheCaseList) {
  for (const ContextCase& c : context_cases()) {
    SCOPED_TRACE(c.name());
    expect_context_matches_float64<ModelTiles>(
        c, static_cast<std::uint32_t>(c.value_blocks * 100 + c.span + c.vectors));
  }
}

// A product per 16 value dims, 16 rows, 32 keys, weight part and value part.
TEST(AmxContext, ModelRunsOneProductPerTileOfWork) {
  struct CountingTiles : ModelTiles {
    static void release() {}  // keeps the count of this call until read below
  };
  for (const int weight_parts : {cpu::kWeightParts, cpu::kFp16VWeightParts, 1}) {
    for (const int value_parts : {1, 2}) {
      expect_context_matches_float64<CountingTiles>({3, 64, 0, 64, 3, value_parts, weight_parts},
                                                    11);
      EXPECT_EQ(ModelTiles::products(), 3 /* value blocks */ * 3 /* row vectors */ *
                                            2 /* key blocks */ * weight_parts * value_parts);
      ModelTiles::release();
    }
  }
}

TEST(AmxContext, HardwareMatchesFloat64) {
  if (!cpu::has_amx()) {
    GTEST_SKIP() << "this CPU has no AMX (or Linux refused its tile data): the AMX path was not "
                    "exercised here; its kernel ran on the model above";
  }
  for (const ContextCase& c : context_cases()) {
    SCOPED_TRACE(c.name());
    expect_context_matches_float64<cpu::HardwareTiles>(c, static_cast<std::uint32_t>(c.span));
  }
}

}  // namespace
}  // namespace attn
