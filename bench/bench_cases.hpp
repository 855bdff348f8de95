// The benchmark cases: shapes from the table, each run at a fixed thread count.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/cases.hpp"

namespace attn::bench {

// What a case times: attn::forward (context only), attn::weights (every weight or the top
// 8 per query row), or attn::backward (dq, dk, dv from the forward's out and lse).
enum class Work : std::uint8_t { forward, weights, top8, backward };

const char* work_name(Work work);

struct BenchCase {
  testing::Case shape;  // [B, Hq, Lq, D] against [B, Hkv, Lk, D], in shape.dtype
  int threads = 1;
  Work work = Work::forward;
  // > 0: a block mask (random_blocks) of about this share of 128 x 128 blocks visible;
  // the name adds "_blocks" and the percentage, and the FLOPs count the visible blocks only.
  double visible_blocks = 0.0;

  // "B1_H8x8_Lq2048_Lk2048_D64_causalTL/threads:2"; weights cases add "_weights" or "_top8"
  // to the shape: "B1_H8x8_Lq2048_Lk2048_D64_top8/threads:1".
  std::string name() const;
  // forward: 2 * D * (visible query-key pairs) for Q K^T plus 2 * Dv * (same) for P V,
  // over all heads and batch entries; keys hidden by causal masking are not counted.
  // weights and top8: 2 * D * (visible pairs), the scores once. backward: the five
  // products Q K^T, dO V^T, P^T dO, dS^T Q and dS K, 2 * (3 D + 2 Dv) * (visible pairs),
  // i.e. 10 L^2 D per head for D = Dv (half for causal).
  double flops() const;
  // The forward case of the same shape and threads, whose time the weights cases are
  // reported against.
  std::string forward_name() const;
};

// The block layout of a masked case: [L / 128][L / 128] flags, the diagonal and then random
// blocks (seeded) until `share` of them are visible, as bench/block_masks.py draws them.
std::vector<bool> random_block_layout(Index length, double share);
// That layout as an attn::BlockMask of 128 x 128 blocks.
BlockMask random_blocks(Index length, double share);

// name, flops, threads and the shape's fields, for --list and --json.
nlohmann::json describe(const BenchCase& bench_case);

// Visible (query, key) pairs of one head: Lq * Lk, or the unmasked part when causal.
double visible_pairs(const testing::Case& shape);

// Prefill: B = 1, H = 8, L in {512, 2048, 8192} (quick: {512, 2048}), D in {64, 128},
// non-causal and causal; decode: Lq = 1 against the same Lk; each at 1 and 2 threads, fp32.
// bf16 and fp16 prefill at L = 2048; a decode step of Hq = 32 on Hkv = 8 against Lk = 32768,
// D = 128, in fp32, bf16 and fp16.
// Block masks (not quick): L = 8192, D = 64, 5%, 25% and 50% of random 128-blocks visible,
// at 1 and 2 threads, reported against the dense case of their threads.
// Weights: every weight and the top 8, at B = 1, H = 8, L = 2048, D = 64, non-causal, at 1
// and 2 threads, each listed right after its forward case. Backward: at L = 2048, D in
// {64, 128}, non-causal and causal, at 1 and 2 threads, right after its forward case.
std::vector<BenchCase> bench_cases(bool quick);

}  // namespace attn::bench
