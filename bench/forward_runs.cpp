// attn_forward_runs: attn::forward at one shape, on one named SIMD target, a given number of
// times and nothing else, for counting instructions under an emulator where no clock means
// anything (bench/arm-instructions.sh): two counts, of 1 and of 3 runs, differ by the
// instructions of 2 forwards alone, without the set-up.
#include <hwy/targets.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "cpu/forward/forward.hpp"

namespace {

// The compiled target that Highway names `name`, if this CPU runs it; 0 otherwise.
std::int64_t target_named(const std::string& name) {
  for (const std::int64_t target : attn::cpu::compiled_targets()) {
    if (name == hwy::TargetName(target)) return target;
  }
  return 0;
}

std::string compiled_target_names() {
  std::string names;
  for (const std::int64_t target : attn::cpu::compiled_targets()) {
    names += std::string(names.empty() ? "" : " ") + hwy::TargetName(target);
  }
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attn_forward_runs: attn::forward at one shape on one SIMD target, N times"};
  std::string target_name;
  attn::Index length = 2048, query_length = 0, dim = 128, heads = 1, kv_heads = 0;
  int runs = 1;
  bool causal = false;
  app.add_option("--target", target_name, "The SIMD target as Highway names it, e.g. SVE2")
      ->required();
  app.add_option("--length", length, "Lk, and Lq unless --query-length")
      ->check(CLI::PositiveNumber);
  app.add_option("--query-length", query_length, "Lq (a decode step: 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--dim", dim, "D = Dv")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "Query heads, batch 1")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", kv_heads, "Key and value heads, dividing --heads (default: --heads)")
      ->check(CLI::PositiveNumber);
  app.add_option("--runs", runs, "How many forwards")->check(CLI::NonNegativeNumber);
  app.add_flag("--causal", causal, "Causal mask");
  CLI11_PARSE(app, argc, argv);

  const std::int64_t target = target_named(target_name);
  if (target == 0) {
    std::fprintf(stderr, "attn_forward_runs: --target %s is not one this CPU runs (%s)\n",
                 target_name.c_str(), compiled_target_names().c_str());
    return 2;
  }
  hwy::SetSupportedTargetsForTest(target);

  if (query_length == 0) query_length = length;
  if (kv_heads == 0) kv_heads = heads;
  if (heads % kv_heads != 0) {
    std::fprintf(stderr, "attn_forward_runs: --kv-heads %lld does not divide --heads %lld\n",
                 static_cast<long long>(kv_heads), static_cast<long long>(heads));
    return 2;
  }
  const attn::Dims q_shape{1, heads, query_length, dim}, kv_shape{1, kv_heads, length, dim};
  std::vector<float> q(static_cast<std::size_t>(heads * query_length * dim)), context(q.size()),
      k(static_cast<std::size_t>(kv_heads * length * dim)), v(k.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : q) x = normal(rng);
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = normal(rng);
    v[i] = normal(rng);
  }
  attn::Options options;
  options.causal = causal;
  const attn::TensorView q_view(q.data(), attn::DType::f32, q_shape),
      k_view(k.data(), attn::DType::f32, kv_shape), v_view(v.data(), attn::DType::f32, kv_shape);
  const attn::Outputs outputs{attn::MutableTensorView(context.data(), attn::DType::f32, q_shape),
                              std::nullopt, std::nullopt};
  for (int run = 0; run < runs; ++run) attn::forward_into(q_view, k_view, v_view, options, outputs);
  std::printf("%s\n", attn::explain(q_view, k_view, v_view, options).plan.c_str());
  return 0;
}
