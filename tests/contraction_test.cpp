// No bit is left to the compiler (docs/architecture.md, "Numerics contract"): the tile
// core's kernels with scalar tails, compiled with the library's -ffp-contract=off and with
// GCC's default -ffp-contract=fast (tests/contraction/), give the same bits on every target,
// at every tail length. A product left to `a += b * c` is fused in the second and not the
// first (mutants/dot-tail-leaves-rounding-to-compiler.patch plants one).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "contraction/kernels.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

namespace contract_fast = testing::contract_fast;
namespace contract_off = testing::contract_off;

std::vector<float> random_floats(Index count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(static_cast<std::size_t>(count));
  for (float& x : out) x = normal(rng);
  return out;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

constexpr DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};

// Highway's own MulAdd on SCALAR is `mul * x + add`, which GCC fuses under
// -ffp-contract=fast where the baseline has an FMA (aarch64, not x86-64): there the target
// cannot tell the tile core's tails from Highway's op, which the library compiles with
// -ffp-contract=off. Every SIMD target runs the same tails and still tells.
bool highway_op_is_contracted(std::int64_t target) {
  return target == HWY_SCALAR && !HWY_ARCH_X86;
}

TEST(Contraction, DotScoresAreTheSameBitsWhateverTheCompilerFuses) {
  testing::for_each_target([](std::int64_t target) {
    if (highway_op_is_contracted(target)) return;
    std::mt19937 rng(7);
    for (const DType dtype : kDtypes)
      for (Index dim = 1; dim <= 40; ++dim)
        for (int rows = 1; rows <= 4; ++rows) {
          const std::vector<float> q = random_floats(rows * dim, rng);
          const std::vector<float> keys = random_floats(4 * dim, rng);
          std::vector<float> off(static_cast<std::size_t>(rows * 4));
          std::vector<float> fast(off.size());
          contract_off::dot_scores(q.data(), keys.data(), dtype, dim, rows, off.data());
          contract_fast::dot_scores(q.data(), keys.data(), dtype, dim, rows, fast.data());
          expect_same_bits(off, fast,
                           std::string(dtype_name(dtype)) + " dim " + std::to_string(dim) +
                               " rows " + std::to_string(rows));
        }
  });
}

TEST(Contraction, ContextByRowsIsTheSameBitsWhateverTheCompilerFuses) {
  testing::for_each_target([](std::int64_t target) {
    if (highway_op_is_contracted(target)) return;
    std::mt19937 rng(11);
    constexpr Index kValues = 9;
    for (const DType dtype : kDtypes)
      for (Index dim = 1; dim <= 40; ++dim)
        for (int rows = 1; rows <= 4; ++rows) {
          const std::vector<float> p = random_floats(rows * kValues, rng);
          const std::vector<float> values = random_floats(kValues * dim, rng);
          std::vector<float> off = random_floats(rows * dim, rng);
          std::vector<float> fast = off;
          contract_off::context_by_rows(p.data(), values.data(), dtype, kValues, dim, rows,
                                        off.data());
          contract_fast::context_by_rows(p.data(), values.data(), dtype, kValues, dim, rows,
                                         fast.data());
          expect_same_bits(off, fast,
                           std::string(dtype_name(dtype)) + " dim " + std::to_string(dim) +
                               " rows " + std::to_string(rows));
        }
  });
}

TEST(Contraction, SoftmaxStepIsTheSameBitsWhateverTheCompilerFuses) {
  testing::for_each_target([](std::int64_t target) {
    if (highway_op_is_contracted(target)) return;
    std::mt19937 rng(13);
    for (Index vectors = 1; vectors <= 4; ++vectors)
      for (int trial = 0; trial < 50; ++trial) {
        constexpr Index kMaxLanes = 16;
        const std::vector<float> scores = random_floats(vectors * kMaxLanes, rng);
        std::vector<float> off{0.5f, 3.0f}, fast = off;  // m, l before the step
        contract_off::softmax_keys(scores.data(), vectors, &off[0], &off[1]);
        contract_fast::softmax_keys(scores.data(), vectors, &fast[0], &fast[1]);
        expect_same_bits(off, fast, "vectors " + std::to_string(vectors));
      }
  });
}

}  // namespace
}  // namespace attn
