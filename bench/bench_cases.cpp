#include "bench_cases.hpp"

#include <algorithm>
#include <random>
#include <vector>

namespace attn::bench {

const char* work_name(Work work) {
  switch (work) {
    case Work::forward:
      return "forward";
    case Work::weights:
      return "weights";
    case Work::top8:
      return "top8";
    case Work::backward:
      return "backward";
  }
  return "forward";
}

std::string BenchCase::name() const {
  std::string suffix = work == Work::forward ? "" : std::string("_") + work_name(work);
  if (visible_blocks > 0.0) {
    suffix += "_blocks" + std::to_string(static_cast<int>(visible_blocks * 100.0 + 0.5));
  }
  return shape.name() + suffix + "/threads:" + std::to_string(threads);
}

std::vector<bool> random_block_layout(Index length, double share) {
  const Index blocks = length / BlockMask::kDefaultBlockSize;
  std::vector<bool> layout(static_cast<std::size_t>(blocks * blocks));
  for (Index b = 0; b < blocks; ++b) layout[static_cast<std::size_t>(b * blocks + b)] = true;
  std::mt19937_64 random(1);
  Index visible = blocks;
  const auto wanted = static_cast<Index>(share * static_cast<double>(blocks * blocks) + 0.5);
  while (visible < wanted) {
    const std::size_t at = random() % layout.size();
    if (!layout[at]) ++visible;
    layout[at] = true;
  }
  return layout;
}

BlockMask random_blocks(Index length, double share) {
  const std::vector<bool> layout = random_block_layout(length, share);
  const Index size = BlockMask::kDefaultBlockSize, blocks = length / size;
  return BlockMask::from_predicate(1, 1, length, length, [&](Index, Index, Index i, Index j) {
    return layout[static_cast<std::size_t>(i / size * blocks + j / size)];
  });
}

std::string BenchCase::forward_name() const {
  return BenchCase{shape, threads, Work::forward}.name();
}

double visible_pairs(const testing::Case& shape) {
  if (!shape.causal) return static_cast<double>(shape.len_q) * static_cast<double>(shape.len_k);
  double pairs = 0.0;
  for (Index i = 0; i < shape.len_q; ++i) {
    const Index position =
        shape.align == CausalAlign::bottom_right ? i + shape.len_k - shape.len_q : i;
    pairs += static_cast<double>(std::clamp<Index>(position + 1, 0, shape.len_k));
  }
  return pairs;
}

double BenchCase::flops() const {
  const double d = static_cast<double>(shape.dim), dv = static_cast<double>(shape.dim_v);
  const double per_pair = work == Work::forward    ? 2.0 * (d + dv)
                          : work == Work::backward ? 2.0 * (3.0 * d + 2.0 * dv)
                                                   : 2.0 * d;
  double share = 1.0;
  if (visible_blocks > 0.0) {
    const std::vector<bool> layout = random_block_layout(shape.len_q, visible_blocks);
    share = static_cast<double>(std::count(layout.begin(), layout.end(), true)) /
            static_cast<double>(layout.size());
  }
  return per_pair * visible_pairs(shape) * share * static_cast<double>(shape.batch * shape.heads_q);
}

nlohmann::json describe(const BenchCase& bench_case) {
  const testing::Case& shape = bench_case.shape;
  return {
      {"name", bench_case.name()},     {"flops", bench_case.flops()},
      {"batch", shape.batch},          {"heads", shape.heads_q},
      {"heads_kv", shape.heads_kv},    {"len_q", shape.len_q},
      {"len_k", shape.len_k},          {"dim", shape.dim},
      {"causal", shape.causal},        {"dtype", dtype_name(shape.dtype)},
      {"threads", bench_case.threads}, {"work", work_name(bench_case.work)},
      {"dropout", shape.dropout},      {"visible_blocks", bench_case.visible_blocks},
  };
}

namespace {

testing::Case fp32_case(Index len_q, Index len_k, Index dim, bool causal) {
  testing::Case c;
  c.batch = 1;
  c.heads_q = c.heads_kv = 8;
  c.len_q = len_q;
  c.len_k = len_k;
  c.dim = c.dim_v = dim;
  c.causal = causal;
  c.dtype = DType::f32;
  return c;
}

testing::Case with_dtype(testing::Case c, DType dtype) {
  c.dtype = dtype;
  return c;
}

}  // namespace

std::vector<BenchCase> bench_cases(bool quick) {
  std::vector<Index> lengths = {512, 2048, 8192};
  if (quick) lengths.pop_back();
  const Index dims[] = {64, 128};
  const int thread_counts[] = {1, 2};
  std::vector<BenchCase> out;
  for (const Index len : lengths)
    for (const Index dim : dims)
      for (const bool causal : {false, true})
        for (const int threads : thread_counts) {
          out.push_back({fp32_case(len, len, dim, causal), threads});
          if (len == 2048)
            out.push_back({fp32_case(len, len, dim, causal), threads, Work::backward});
          if (len == 2048 && dim == 64 && !causal) {
            out.push_back({fp32_case(len, len, dim, causal), threads, Work::weights});
            out.push_back({fp32_case(len, len, dim, causal), threads, Work::top8});
          }
          if (len == 2048 && dim == 64) {  // training with dropout, beside the same without
            testing::Case dropout = fp32_case(len, len, dim, causal);
            dropout.dropout = 0.1;
            out.push_back({dropout, threads});
            out.push_back({dropout, threads, Work::backward});
          }
        }
  // Block masks at L = 8192 (not quick), D = 64: 5%, 25% and 50% of 128-blocks visible,
  // each right after its dense case's last thread count, whose time they are held against.
  if (!quick) {
    for (const int threads : thread_counts)
      for (const double share : {0.05, 0.25, 0.5})
        out.push_back({fp32_case(8192, 8192, 64, false), threads, Work::forward, share});
  }
  // Decode: one new query against the whole cache, non-causal: bottom-right causal would hide
  // nothing, and top-left would hide every key but the first.
  for (const Index len : lengths)
    for (const Index dim : dims)
      for (const int threads : thread_counts)
        out.push_back({fp32_case(1, len, dim, false), threads});
  // The dtypes models run in: bf16 and fp16 prefill at L = 2048 (the table), and a
  // grouped-query decode step (32 query heads on 8 KV heads, as Llama-3-8B) against a cache
  // that sits in L3 (Lk 4096: 16 MiB in 16 bits) and a long one, in every dtype.
  for (const DType dtype : {DType::bf16, DType::f16})
    for (const Index dim : dims)
      for (const bool causal : {false, true})
        for (const int threads : thread_counts)
          out.push_back({with_dtype(fp32_case(2048, 2048, dim, causal), dtype), threads});
  for (const Index cache : {4096, 32768})
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16})
      for (const int threads : thread_counts) {
        testing::Case decode = with_dtype(fp32_case(1, cache, 128, false), dtype);
        decode.heads_q = 32;
        out.push_back({decode, threads});
      }
  return out;
}

}  // namespace attn::bench
