// The benchmark cases: shapes from the table, each run at a fixed thread count.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/cases.hpp"

namespace attn::bench {

struct BenchCase {
  testing::Case shape;  // fp32, [B, H, Lq, D] against [B, H, Lk, D]
  int threads = 1;

  // "B1_H8x8_Lq2048_Lk2048_D64_causalTL/threads:2"
  std::string name() const;
  // 2 * D * (visible query-key pairs) for Q K^T plus 2 * Dv * (same) for P V, over all heads
  // and batch entries; keys hidden by causal masking are not counted.
  double flops() const;
};

// name, flops, threads and the shape's fields, for --list and --json.
nlohmann::json describe(const BenchCase& bench_case);

// Visible (query, key) pairs of one head: Lq * Lk, or the unmasked part when causal.
double visible_pairs(const testing::Case& shape);

// Prefill: B = 1, H = 8, L in {512, 2048, 8192} (quick: {512, 2048}), D in {64, 128},
// non-causal and causal; decode: Lq = 1 against the same Lk; each at 1 and 2 threads.
std::vector<BenchCase> bench_cases(bool quick);

}  // namespace attn::bench
