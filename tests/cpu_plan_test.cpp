// The plan of a call (src/cpu/plan/plan.hpp) for targets and CPUs this machine may not have:
// which kernel scores each chunk, how items are cut, what is packed, each item's context.
#include <gtest/gtest.h>

#include <string>

#include "core/problem.hpp"
#include "cpu/amx/context.hpp"
#include "cpu/cpu_model.hpp"
#include "cpu/plan/plan.hpp"
#include "support/cases.hpp"

namespace attn {
namespace {

using cpu::ContextKernel;
using cpu::Plan;
using cpu::PlanTarget;
using cpu::ScoreKernel;

struct Planned {
  testing::Inputs inputs;
  core::Problem problem;
};

Planned problem_of(testing::Case c) {
  Planned out{testing::make_inputs(c), {}};
  out.problem = core::make_problem(out.inputs.q, out.inputs.k, out.inputs.v, out.inputs.options);
  return out;
}

testing::Case shaped(Index heads_q, Index heads_kv, Index len_q, Index len_k, Index dim,
                     DType dtype = DType::f32) {
  testing::Case c;
  c.heads_q = heads_q, c.heads_kv = heads_kv, c.len_q = len_q, c.len_k = len_k;
  c.dim = c.dim_v = dim, c.dtype = dtype;
  return c;
}

constexpr PlanTarget kAvx2{8, false, false, false};
constexpr PlanTarget kSse4{4, false, false, false};
// AVX512-BF16 where vdpbf16ps pays (Zen 4); AMX, with a vdpbf16ps at half the FMA's rate that
// does not (Sapphire Rapids); AVX-512 without either (Intel's without AMX); AMX where vdpbf16ps
// pays too (no CPU yet: the plan takes each where it can).
constexpr PlanTarget kZen4{16, true, true, false};
constexpr PlanTarget kSapphireRapids{16, true, false, true};
constexpr PlanTarget kAvx512{16, true, false, false};
constexpr PlanTarget kAmxAndDot{16, true, true, true};

TEST(Plan, AChunkOfAtMostHalfAVectorOfRowsIsScoredByDotProducts) {
  const Planned p = problem_of(shaped(2, 2, 3, 97, 24));  // 3 rows per KV head
  EXPECT_EQ(Plan(p.problem, kAvx2).chunk_scores(3), ScoreKernel::dot);
  EXPECT_EQ(Plan(p.problem, kSse4).chunk_scores(3), ScoreKernel::float_chain);
  EXPECT_EQ(Plan(p.problem, kSse4).chunk_scores(2), ScoreKernel::dot);
  EXPECT_EQ(Plan(p.problem, kZen4).chunk_scores(8), ScoreKernel::dot);
  EXPECT_EQ(Plan(p.problem, kZen4).chunk_scores(9), ScoreKernel::float_chain);
}

TEST(Plan, ChunksCutAnItemsRowsIntoVectorsOfThree) {
  const Planned p = problem_of(shaped(4, 1, 40, 50, 16));
  const Plan plan(p.problem, kAvx2);
  for (Index rows = 1; rows <= plan.rows_per_item(); ++rows) {
    Index next = 0;
    for (const cpu::ChunkRows& chunk : plan.chunks(rows)) {
      EXPECT_EQ(chunk.first_row, next);
      EXPECT_LE(chunk.vectors, 3);
      EXPECT_EQ(chunk.scores, plan.chunk_scores(chunk.rows));
      EXPECT_LE(chunk.rows, chunk.vectors * 8);
      next += chunk.rows;
    }
    EXPECT_EQ(next, rows);
  }
}

TEST(Plan, ItemsAreSizedByKAloneSoThatWeightsPlanForwardsScores) {
  testing::Case f32 = shaped(4, 2, 300, 80, 32);
  const Planned plain = problem_of(f32);
  EXPECT_EQ(Plan(plain.problem, kAvx2).positions_per_item(), 48 / 2);  // 6 vectors of 8 rows
  testing::Case half = f32;
  half.dtype = DType::bf16;
  EXPECT_EQ(Plan(problem_of(half).problem, kAvx2).positions_per_item(), 96 / 2);
  // The same q and k with V in another dtype (a weights call has v = k): the same items.
  Planned mixed = problem_of(f32);
  const testing::Inputs bf16 = testing::make_inputs(half);
  mixed.problem = core::make_problem(mixed.inputs.q, mixed.inputs.k, bf16.v, mixed.inputs.options);
  const Plan a(plain.problem, kAvx2), b(mixed.problem, kAvx2);
  ASSERT_EQ(a.items().size(), b.items().size());
  for (std::size_t i = 0; i < a.items().size(); ++i) {
    EXPECT_EQ(a.items()[i].first_position, b.items()[i].first_position);
    EXPECT_EQ(a.items()[i].positions, b.items()[i].positions);
  }
}

TEST(Plan, ItemOfFindsEveryPositionsItem) {
  testing::Case c = shaped(6, 2, 130, 90, 16);
  c.packed = true;
  const Planned p = problem_of(c);
  const Plan plan(p.problem, kZen4);
  for (std::size_t at = 0; at < plan.items().size(); ++at) {
    const cpu::WorkItem& item = plan.items()[at];
    for (Index i = item.first_position; i < item.first_position + item.positions; ++i) {
      EXPECT_EQ(plan.item_of(item.segment, item.kv_head, i), static_cast<Index>(at));
    }
  }
}

TEST(Plan, Bf16TakesTilesOrTheDotInstructionWhereTheyPay) {
  const Planned p = problem_of(shaped(8, 2, 100, 100, 64, DType::bf16));
  EXPECT_EQ(Plan(p.problem, kAvx2).wide_scores(), ScoreKernel::float_chain);
  EXPECT_EQ(Plan(p.problem, kAvx512).wide_scores(), ScoreKernel::float_chain);
  EXPECT_EQ(Plan(p.problem, kZen4).wide_scores(), ScoreKernel::bf16_pairs);
  EXPECT_EQ(Plan(p.problem, kSapphireRapids).wide_scores(), ScoreKernel::bf16_tiles);
  EXPECT_EQ(Plan(p.problem, kAmxAndDot).wide_scores(), ScoreKernel::bf16_tiles);
  const Planned odd = problem_of(shaped(8, 2, 100, 100, 40, DType::bf16));  // not 32 | dim
  EXPECT_EQ(Plan(odd.problem, kSapphireRapids).wide_scores(), ScoreKernel::float_chain);
  EXPECT_EQ(Plan(odd.problem, kAmxAndDot).wide_scores(), ScoreKernel::bf16_pairs);
}

TEST(Plan, Fp16GoesOnTilesAsItsPartsOnlyWhereTheCpuHasAmx) {
  const Planned p = problem_of(shaped(8, 2, 100, 100, 64, DType::f16));
  EXPECT_EQ(Plan(p.problem, kZen4).wide_scores(), ScoreKernel::float_chain);
  EXPECT_FALSE(Plan(p.problem, kZen4).splits_keys());
  const Plan plan(p.problem, kSapphireRapids);
  EXPECT_EQ(plan.wide_scores(), ScoreKernel::fp16_parts);
  EXPECT_TRUE(plan.splits_keys());
  // Decoding (one row per KV head) has no wide chunk: K is not split.
  const Planned decode = problem_of(shaped(2, 2, 1, 300, 64, DType::f16));
  EXPECT_FALSE(Plan(decode.problem, kSapphireRapids).splits_keys());
}

TEST(Plan, TheAmxContextServesItemsWithoutNarrowChunks) {
  // Items of 24 positions x 4 rows; the last holds 2 positions, 8 rows: a narrow chunk.
  const Planned p = problem_of(shaped(8, 2, 98, 100, 64, DType::bf16));
  const Plan plan(p.problem, kSapphireRapids);
  ASSERT_TRUE(plan.packs_values());
  bool tiles = false, rows = false;
  for (const cpu::WorkItem& item : plan.items()) {
    const Index item_rows = item.positions * p.problem.group_size();
    bool narrow = false;
    for (const cpu::ChunkRows& chunk : plan.chunks(item_rows)) {
      narrow |= cpu::scores_by_dot(chunk.scores);
    }
    const ContextKernel context = plan.context_of(item);
    EXPECT_EQ(context, narrow ? ContextKernel::float_rows : ContextKernel::amx_tiles);
    tiles |= context == ContextKernel::amx_tiles;
    rows |= context == ContextKernel::float_rows;
  }
  EXPECT_TRUE(tiles && rows);
  EXPECT_FALSE(Plan(p.problem, kZen4).packs_values());
  const Planned few = problem_of(shaped(2, 2, 20, 100, 64, DType::bf16));  // 20 rows a head
  EXPECT_FALSE(Plan(few.problem, kSapphireRapids).packs_values());
}

// Options::pv_precision bf16: one rounded part of each weight on AMX tiles (two against fp16
// V), three exact ones for exact; the plan says which.
TEST(Plan, PvPrecisionChoosesTheWeightPartsOfTheAmxContext) {
  Planned p = problem_of(shaped(8, 2, 98, 100, 64, DType::bf16));
  const Plan exact(p.problem, kSapphireRapids);
  EXPECT_EQ(exact.weight_parts(), cpu::kWeightParts);
  EXPECT_NE(exact.describe().find("P in three exact bf16 parts"), std::string::npos);
  p.problem.pv_precision = PvPrecision::bf16;
  const Plan rounded(p.problem, kSapphireRapids);
  EXPECT_EQ(rounded.weight_parts(), 1);
  EXPECT_NE(rounded.describe().find("P rounded to bf16"), std::string::npos);
  Planned fp16 = problem_of(shaped(8, 2, 98, 100, 64, DType::f16));
  fp16.problem.pv_precision = PvPrecision::bf16;
  const Plan two_parts(fp16.problem, kSapphireRapids);
  EXPECT_EQ(two_parts.weight_parts(), cpu::kFp16VWeightParts);
  EXPECT_NE(two_parts.describe().find("P in two bf16 parts"), std::string::npos);
}

// Without AMX, P rounded to bf16 takes vdpbf16ps for P V beside the AVX512-BF16 scores, on
// items without narrow chunks; exact P stays on float rows, where three parts would cost more.
TEST(Plan, PvPrecisionBf16TakesTheDotInstructionWithoutAmx) {
  Planned p = problem_of(shaped(8, 2, 98, 100, 64, DType::bf16));
  EXPECT_FALSE(Plan(p.problem, kZen4).packs_values());
  p.problem.pv_precision = PvPrecision::bf16;
  const Plan plan(p.problem, kZen4);
  ASSERT_TRUE(plan.packs_values());
  EXPECT_EQ(plan.weight_parts(), 1);
  bool pairs = false, rows = false;
  for (const cpu::WorkItem& item : plan.items()) {
    const ContextKernel context = plan.context_of(item);
    pairs |= context == ContextKernel::bf16_pairs;
    rows |= context == ContextKernel::float_rows;
  }
  EXPECT_TRUE(pairs && rows);  // the last item's 8 rows are a narrow chunk
  const std::string text = plan.describe();
  EXPECT_NE(text.find("context: AVX512-BF16 dot products (vdpbf16ps), V^T packed per KV head "
                      "(P rounded to bf16"),
            std::string::npos)
      << text;
  EXPECT_FALSE(Plan(p.problem, kAvx512).packs_values());  // vdpbf16ps does not pay
  Planned mixed = problem_of(shaped(8, 2, 98, 100, 64, DType::bf16));
  mixed.problem.v.dtype = DType::f16;
  mixed.problem.pv_precision = PvPrecision::bf16;
  EXPECT_FALSE(Plan(mixed.problem, kZen4).packs_values());
}

TEST(Plan, NarrowTilesReadSixteenBitKAndVInPlaceWithoutAMask) {
  const Planned half = problem_of(shaped(2, 2, 1, 300, 64, DType::f16));
  EXPECT_TRUE(Plan(half.problem, kAvx2).narrow_tiles_in_place());
  testing::Case masked = shaped(2, 2, 1, 300, 64, DType::f16);
  masked.mask = testing::MaskCase::boolean;
  EXPECT_FALSE(Plan(problem_of(masked).problem, kAvx2).narrow_tiles_in_place());
  EXPECT_FALSE(Plan(problem_of(shaped(2, 2, 1, 300, 64)).problem, kAvx2).narrow_tiles_in_place());
}

// Narrow chunks of bf16 q and k take vdpbf16ps on an AVX-512 target of a CPU where it pays
// (any head dim); their in-place tiles' P V too for bf16 V with P rounded and
// dim_v a multiple of 32.
TEST(Plan, NarrowChunksOfBf16TakeTheDotInstruction) {
  Planned bf16 = problem_of(shaped(8, 2, 1, 300, 64, DType::bf16));
  bf16.problem.pv_precision = PvPrecision::bf16;
  const Plan zen4(bf16.problem, kZen4);
  EXPECT_EQ(zen4.narrow_scores(), ScoreKernel::dot_bf16);
  EXPECT_EQ(zen4.chunk_scores(4), ScoreKernel::dot_bf16);
  EXPECT_TRUE(zen4.narrow_context_on_pairs());
  EXPECT_NE(zen4.describe().find("on V rows paired key by key"), std::string::npos);
  EXPECT_EQ(Plan(bf16.problem, kAvx2).narrow_scores(), ScoreKernel::dot);
  EXPECT_FALSE(Plan(bf16.problem, kAvx2).narrow_context_on_pairs());
  EXPECT_EQ(Plan(bf16.problem, kAvx512).narrow_scores(), ScoreKernel::dot);
  EXPECT_EQ(Plan(bf16.problem, kSapphireRapids).narrow_scores(), ScoreKernel::dot);
  EXPECT_FALSE(Plan(bf16.problem, kSapphireRapids).narrow_context_on_pairs());
  bf16.problem.pv_precision = PvPrecision::exact;
  EXPECT_FALSE(Plan(bf16.problem, kZen4).narrow_context_on_pairs());
  Planned odd = problem_of(shaped(8, 2, 1, 300, 41, DType::bf16));
  odd.problem.pv_precision = PvPrecision::bf16;
  EXPECT_EQ(Plan(odd.problem, kZen4).narrow_scores(), ScoreKernel::dot_bf16);
  EXPECT_FALSE(Plan(odd.problem, kZen4).narrow_context_on_pairs());
  EXPECT_EQ(Plan(problem_of(shaped(8, 2, 1, 300, 64)).problem, kZen4).narrow_scores(),
            ScoreKernel::dot);
  EXPECT_EQ(Plan(problem_of(shaped(8, 2, 1, 300, 64, DType::f16)).problem, kZen4).narrow_scores(),
            ScoreKernel::dot);
}

TEST(Plan, KeyTilesAreNarrowerAtWideHeads) {
  EXPECT_EQ(Plan(problem_of(shaped(2, 2, 10, 10, 128)).problem, kAvx2).key_tile(), 128);
  EXPECT_EQ(Plan(problem_of(shaped(2, 2, 10, 10, 256)).problem, kAvx2).key_tile(), 64);
}

TEST(Plan, KeyTilesAreWiderWhereAmxScoresWideBf16Heads) {
  const auto key_tile = [](Index dim, DType dtype, PlanTarget target) {
    return Plan(problem_of(shaped(2, 2, 10, 10, dim, dtype)).problem, target).key_tile();
  };
  EXPECT_EQ(key_tile(128, DType::bf16, kSapphireRapids), 256);
  EXPECT_EQ(key_tile(160, DType::bf16, kSapphireRapids), 256);
  EXPECT_EQ(key_tile(64, DType::bf16, kSapphireRapids), 128);
  EXPECT_EQ(key_tile(256, DType::bf16, kSapphireRapids), 64);
  EXPECT_EQ(key_tile(128, DType::bf16, kZen4), 128);
  EXPECT_EQ(key_tile(128, DType::f16, kSapphireRapids), 128);
  EXPECT_EQ(key_tile(128, DType::f32, kSapphireRapids), 128);
}

// CPUID leaf 1 signatures as these CPUs report them: Emerald and Sapphire Rapids issue
// vdpbf16ps at half the FMA's rate and widen bf16 instead; Zen 4 and Zen 5 take it.
TEST(CpuModel, Bf16ProductsTakeVdpbf16psOffIntelsHalfRateModels) {
  const cpu::CpuModel emerald = cpu::cpu_model_of(true, 0x000C06F2);
  EXPECT_EQ(emerald.family, 6u);
  EXPECT_EQ(emerald.model, 207u);
  EXPECT_FALSE(cpu::bf16_dot_at_fma_rate(emerald));
  EXPECT_FALSE(cpu::bf16_dot_at_fma_rate(cpu::cpu_model_of(true, 0x000806F8)));  // model 143
  EXPECT_TRUE(cpu::bf16_dot_at_fma_rate(cpu::cpu_model_of(false, 0x000C06F2)));  // not Intel's
  const cpu::CpuModel zen4 = cpu::cpu_model_of(false, 0x00A10F11);
  EXPECT_EQ(zen4.family, 25u);
  EXPECT_EQ(zen4.model, 17u);
  EXPECT_TRUE(cpu::bf16_dot_at_fma_rate(zen4));
  const cpu::CpuModel zen5 = cpu::cpu_model_of(false, 0x00B00F20);
  EXPECT_EQ(zen5.family, 26u);
  EXPECT_EQ(zen5.model, 2u);
  EXPECT_TRUE(cpu::bf16_dot_at_fma_rate(zen5));
}

TEST(Plan, DescribeNamesTheKernels) {
  const Planned p = problem_of(shaped(8, 2, 100, 100, 64, DType::bf16));
  const std::string text = Plan(p.problem, kAmxAndDot).describe();
  EXPECT_NE(text.find("AMX bf16 tiles for chunks of more than 8 rows"), std::string::npos) << text;
  EXPECT_NE(text.find("AVX512-BF16 dot products along d (vdpbf16ps) for fewer"), std::string::npos)
      << text;
  const std::string widened = Plan(p.problem, kSapphireRapids).describe();
  EXPECT_NE(widened.find("AMX bf16 tiles for chunks"), std::string::npos) << widened;
  EXPECT_NE(widened.find(", dot products along d for fewer"), std::string::npos) << widened;
  EXPECT_NE(text.find("V^T packed per KV head"), std::string::npos) << text;
}

}  // namespace
}  // namespace attn
