// attn::BlockMask: each pattern against its definition, and the kernels given one against
// the same pattern as a dense boolean mask (bitwise, on every target) and against the
// float64 reference (forward, lse, weights and backward; packed sequences too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/error_message.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

using Block = BlockMask::Block;

// The call throws an attn::Error naming `argument` first.
template <class Call>
void expect_refused(Call&& call, const std::string& argument) {
  const std::string message = testing::error_message(call);
  EXPECT_EQ(message.rfind(argument + ":", 0), 0u) << message;
}
using Predicate = std::function<bool(Index, Index, Index, Index)>;

// A pattern: its block mask and its definition, element by element.
struct Pattern {
  std::string name;
  BlockMask mask;
  Predicate shows;
};

// Ragged documents: lengths 1 to 90, drawn per batch entry.
std::vector<std::int64_t> ragged_documents(Index batch, Index length, unsigned seed) {
  std::mt19937 random(seed);
  std::vector<std::int64_t> ids;
  for (Index b = 0; b < batch; ++b) {
    std::int64_t id = 0;
    Index left = 0;
    for (Index i = 0; i < length; ++i) {
      if (left == 0) {
        left = 1 + static_cast<Index>(random() % 90);
        ++id;
      }
      ids.push_back(id);
      --left;
    }
  }
  return ids;
}

// Random blocks of `size`: a third empty, a third full, a third partial at random bits, and
// query block 1 empty everywhere (rows that see no key).
Pattern random_blocks(Index batch, Index heads, Index len_q, Index len_k, Index size,
                      unsigned seed) {
  const Index qbs = (len_q + size - 1) / size, kbs = (len_k + size - 1) / size;
  std::mt19937 random(seed);
  auto kinds = std::make_shared<std::vector<int>>(batch * heads * qbs * kbs);
  for (int& kind : *kinds) kind = static_cast<int>(random() % 3);
  const unsigned salt = random();
  Predicate shows = [=](Index b, Index h, Index i, Index j) {
    if (i / size == 1) return false;
    const int kind =
        (*kinds)[static_cast<std::size_t>(((b * heads + h) * qbs + i / size) * kbs + j / size)];
    if (kind < 2) return kind == 1;
    return ((static_cast<std::uint64_t>(i) * 7919u + static_cast<std::uint64_t>(j) * 104729u +
             salt) >>
            3) %
               3 ==
           0;
  };
  return {"random_" + std::to_string(size),
          BlockMask::from_predicate(batch, heads, len_q, len_k, shows, size), shows};
}

std::vector<Pattern> patterns(Index batch, Index heads, Index len_q, Index len_k) {
  std::vector<Pattern> out;
  const std::vector<std::int64_t> q_docs = ragged_documents(batch, len_q, 3);
  const std::vector<std::int64_t> k_docs =
      len_q == len_k ? q_docs : ragged_documents(batch, len_k, 4);
  out.push_back({"documents", BlockMask::documents(q_docs, k_docs, batch, 32),
                 [=](Index b, Index, Index i, Index j) {
                   return q_docs[static_cast<std::size_t>(b * len_q + i)] ==
                          k_docs[static_cast<std::size_t>(b * len_k + j)];
                 }});
  std::vector<Index> prefixes;
  for (Index b = 0; b < batch; ++b) prefixes.push_back(37 + 101 * b);
  out.push_back({"prefix_lm", BlockMask::prefix_lm(prefixes, len_q, len_k, 64),
                 [=](Index b, Index, Index i, Index j) {
                   return j < prefixes[static_cast<std::size_t>(b)] || j <= i;
                 }});
  out.push_back({"chunked", BlockMask::chunked(50, len_q, len_k, 16),
                 [](Index, Index, Index i, Index j) { return i / 50 == j / 50; }});
  const std::vector<Index> globals{0, 150};
  out.push_back({"window_global", BlockMask::window_and_global(20, globals, len_q, len_k),
                 [](Index, Index, Index i, Index j) {
                   return std::abs(i - j) <= 20 || i == 0 || i == 150 || j == 0 || j == 150;
                 }});
  out.push_back(random_blocks(batch, heads, len_q, len_k, 32, 5));
  out.push_back(random_blocks(1, 1, len_q, len_k, 128, 6));
  return out;
}

TEST(BlockMask, EachPatternShowsWhatItsDefinitionShows) {
  for (const Pattern& pattern : patterns(2, 3, 300, 410)) {
    SCOPED_TRACE(pattern.name);
    const BlockMask& m = pattern.mask;
    const Tensor dense = m.to_dense();
    const bool* flags = dense.data_as<bool>();
    Index mismatches = 0;
    for (Index b = 0; b < m.batch(); ++b)
      for (Index h = 0; h < m.heads(); ++h)
        for (Index i = 0; i < m.len_q(); ++i)
          for (Index j = 0; j < m.len_k(); ++j) mismatches += *flags++ != pattern.shows(b, h, i, j);
    EXPECT_EQ(mismatches, 0);
    // Every block's kind is what its elements make it.
    const Index size = m.block_size();
    for (Index b = 0; b < m.batch(); ++b) {
      for (Index h = 0; h < m.heads(); ++h) {
        for (Index qb = 0; qb < m.query_blocks(); ++qb) {
          for (Index kb = 0; kb < m.key_blocks(); ++kb) {
            Index shown = 0, all = 0;
            for (Index i = qb * size; i < std::min(m.len_q(), (qb + 1) * size); ++i) {
              for (Index j = kb * size; j < std::min(m.len_k(), (kb + 1) * size); ++j) {
                shown += pattern.shows(b, h, i, j);
                ++all;
              }
            }
            const Block want = shown == 0     ? Block::empty
                               : shown == all ? Block::full
                                              : Block::partial;
            ASSERT_EQ(m.block(b, h, qb, kb), want) << b << " " << h << " " << qb << " " << kb;
          }
        }
      }
    }
    EXPECT_EQ(m.count(Block::empty) + m.count(Block::full) + m.count(Block::partial),
              m.batch() * m.heads() * m.query_blocks() * m.key_blocks());
    // A round trip through the dense mask builds the same blocks.
    const BlockMask again = BlockMask::from_dense(dense.view(), m.block_size());
    EXPECT_EQ(again.count(Block::partial), m.count(Block::partial));
    EXPECT_EQ(again.count(Block::empty), m.count(Block::empty));
  }
}

TEST(BlockMask, RefusesBadArguments) {
  const auto always = [](Index, Index, Index, Index) { return true; };
  expect_refused([&] { (void)BlockMask::from_predicate(1, 1, 8, 8, always, 48); }, "block_size");
  expect_refused([&] { (void)BlockMask::from_predicate(1, 1, 8, 8, always, 8); }, "block_size");
  expect_refused([&] { (void)BlockMask::from_predicate(1, 0, 8, 8, always); }, "heads");
  expect_refused([&] { (void)BlockMask::from_predicate(1, 1, 0, 8, always); }, "len_q");
  expect_refused([&] { (void)BlockMask::chunked(0, 8, 8); }, "chunk");
  const std::vector<Index> negative{-1};
  expect_refused([&] { (void)BlockMask::prefix_lm(negative, 8, 8); }, "prefix_lengths");
  expect_refused([&] { (void)BlockMask::window_and_global(-1, {}, 8, 8); }, "window");
  const std::vector<Index> outside{8};
  expect_refused([&] { (void)BlockMask::window_and_global(2, outside, 8, 8); }, "global_tokens");
  const std::vector<std::int64_t> three(3);
  expect_refused([&] { (void)BlockMask::documents(three, three, 2); }, "query_documents");
  Tensor floats(DType::f32, {1, 1, 4, 4});
  expect_refused([&] { (void)BlockMask::from_dense(floats.view()); }, "mask");
}

testing::Case shaped(Index batch, Index hq, Index hkv, Index len_q, Index len_k, Index dim,
                     DType dtype) {
  testing::Case c;
  c.batch = batch, c.heads_q = hq, c.heads_kv = hkv, c.len_q = len_q, c.len_k = len_k;
  c.dim = dim, c.dim_v = dim, c.dtype = dtype;
  return c;
}

// The cases: ragged tails of rows and keys, GQA, every dtype, and the options that shape
// scores (causal, a window, softcap with ALiBi and sinks) and dropout.
std::vector<testing::Case> block_cases() {
  std::vector<testing::Case> out;
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    out.push_back(shaped(2, 4, 2, 300, 300, 64, dtype));
  }
  testing::Case causal = shaped(1, 2, 1, 300, 410, 40, DType::f32);
  causal.causal = true, causal.align = CausalAlign::bottom_right;
  out.push_back(causal);
  testing::Case shaped_scores = shaped(2, 3, 3, 300, 410, 48, DType::bf16);
  shaped_scores.softcap = 30.0, shaped_scores.alibi = true, shaped_scores.sinks = true;
  out.push_back(shaped_scores);
  // Where AMX scores bf16 heads of 128, a key tile spans 256 keys: many blocks each.
  out.push_back(shaped(1, 2, 1, 300, 600, 128, DType::bf16));
  testing::Case window = shaped(1, 3, 1, 300, 300, 128, DType::f16);
  window.window = {64, 16};
  out.push_back(window);
  testing::Case dropout = shaped(1, 2, 2, 300, 300, 32, DType::f32);
  dropout.dropout = 0.2, dropout.causal = true;
  out.push_back(dropout);
  return out;
}

// The mask as a dense boolean tensor of the problem's batch and heads.
Tensor dense_of(const BlockMask& mask, const testing::Case& c) {
  const Tensor own = mask.to_dense();
  Tensor out(DType::boolean, {c.batch, c.heads_q, c.len_q, c.len_k});
  bool* to = out.data_as<bool>();
  const bool* from = own.data_as<bool>();
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.heads_q; ++h)
      for (Index i = 0; i < c.len_q; ++i)
        for (Index j = 0; j < c.len_k; ++j)
          *to++ =
              from[((b % mask.batch() * mask.heads() + h % mask.heads()) * c.len_q + i) * c.len_k +
                   j];
  return out;
}

// Forward's context, lse and weights in float32 (float64 from the reference, which takes
// float64 outputs), so that no output rounding hides a difference.
Result forward_floats(const testing::Inputs& in, const Options& options) {
  const DType out = options.backend == Backend::reference ? DType::f64 : DType::f32;
  const Dims shape = in.q.shape;
  Result r{Tensor(out, {shape[0], shape[1], shape[2], in.v.shape[3]}),
           Tensor(out, {shape[0], shape[1], shape[2], 1}),
           Tensor(out, {shape[0], shape[1], shape[2], in.k.shape[2]})};
  forward_into(in.q, in.k, in.v, options,
               {r.context.mutable_view(), r.lse.mutable_view(), r.weights.mutable_view()});
  return r;
}

// Backward's gradients in float32 (float64 from the reference).
BackwardResult backward_floats(const BackwardInputs& inputs, const Options& options) {
  const DType out = options.backend == Backend::reference ? DType::f64 : DType::f32;
  BackwardResult r{Tensor(out, inputs.q.shape), Tensor(out, inputs.k.shape),
                   Tensor(out, inputs.v.shape), Tensor(out, {1, inputs.q.shape[1], 1, 1}),
                   Tensor()};
  Gradients g{r.dq.mutable_view(), r.dk.mutable_view(), r.dv.mutable_view(), std::nullopt,
              std::nullopt};
  if (!options.sinks.empty()) g.dsinks = r.dsinks.mutable_view();
  backward_into(inputs, options, g);
  return r;
}

void expect_same_bits(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.nbytes()), 0) << what << " differs";
}

void expect_close(const Tensor& got, const Tensor& want, double nmse, const char* what) {
  const testing::Comparison c = testing::compare(got.view(), want.view());
  EXPECT_TRUE(c.hard_failure.empty()) << what << ": " << testing::describe(c);
  EXPECT_LT(c.nmse, nmse) << what << ": " << testing::describe(c);
}

// Bounds against float64, as the fast forward's and backward's own tests hold them.
constexpr double kContextNmse = 1e-11;
constexpr double kGradientNmse = 1e-9;

TEST(BlockMaskKernels, ForwardWeightsAndBackwardMatchTheDenseMaskAndTheReference) {
  const std::vector<testing::Case> cases = block_cases();
  for (std::size_t index = 0; index < cases.size(); ++index) {
    const testing::Case& c = cases[index];
    const std::vector<Pattern> all = patterns(c.batch, c.heads_q, c.len_q, c.len_k);
    // Every pattern on the first case; on the others one pattern in turn and random blocks.
    std::vector<Pattern> chosen = all;
    if (index > 0) chosen = {all[index % (all.size() - 1)], all.back()};
    for (const Pattern& pattern : chosen) {
      SCOPED_TRACE(c.name() + " " + pattern.name);
      const testing::Inputs in = testing::make_inputs(c);
      const Tensor dense = dense_of(pattern.mask, c);
      Options blocks = in.options, masked = in.options;
      blocks.block_mask = pattern.mask;
      masked.mask = dense.view();
      Options reference = blocks;
      reference.backend = Backend::reference;
      const Result want = forward_floats(in, reference);
      // The reference reads the block mask as it reads the dense one.
      Options dense_reference = masked;
      dense_reference.backend = Backend::reference;
      expect_same_bits(forward_floats(in, dense_reference).context, want.context,
                       "reference context");
      testing::for_each_target([&] {
        const Result got = forward_floats(in, blocks);
        const Result dense_got = forward_floats(in, masked);
        expect_same_bits(got.context, dense_got.context, "context");
        expect_same_bits(got.lse, dense_got.lse, "lse");
        expect_same_bits(got.weights, dense_got.weights, "weights");
        expect_close(got.context, want.context, kContextNmse, "context");
        expect_close(got.weights, want.weights, kContextNmse, "weights");
        const WeightsResult alone = weights(in.q, in.k, blocks);
        expect_same_bits(alone.weights, dense_got.weights, "weights pass");
        WeightSelection top_5;
        top_5.top_k = 5;
        const WeightsResult top = weights(in.q, in.k, blocks, top_5);
        const WeightsResult dense_top = weights(in.q, in.k, masked, top_5);
        expect_same_bits(top.weights, dense_top.weights, "top-k weights");
        EXPECT_EQ(top.indices, dense_top.indices);
      });
      // Backward: the fast kernel's gradients with the block mask are the dense mask's.
      // out and lse in float32 (as the backward tests take them), dout random (dim_v = dim).
      const Result out = forward_floats(in, blocks);
      const testing::Inputs grads = testing::make_inputs(c, 9);
      const BackwardInputs inputs{in.q, in.k, in.v, out.context.view(), out.lse.view(), grads.q};
      const BackwardResult got = backward_floats(inputs, blocks);
      const BackwardResult dense_got = backward_floats(inputs, masked);
      expect_same_bits(got.dq, dense_got.dq, "dq");
      expect_same_bits(got.dk, dense_got.dk, "dk");
      expect_same_bits(got.dv, dense_got.dv, "dv");
      expect_same_bits(got.dsinks, dense_got.dsinks, "dsinks");
      Options reference_backward = blocks;
      reference_backward.backend = Backend::reference;
      const BackwardResult want_grads = backward_floats(inputs, reference_backward);
      expect_close(got.dq, want_grads.dq, kGradientNmse, "dq");
      expect_close(got.dk, want_grads.dk, kGradientNmse, "dk");
      expect_close(got.dv, want_grads.dv, kGradientNmse, "dv");
    }
  }
}

// Keys that every row's blocks hide are never read: NaN there cannot reach the output.
TEST(BlockMaskKernels, SkipsTheKeysOfEmptyBlocks) {
  testing::Case c = shaped(1, 2, 2, 256, 512, 64, DType::f32);
  testing::Inputs in = testing::make_inputs(c);
  const BlockMask mask = BlockMask::from_predicate(
      1, 1, c.len_q, c.len_k, [](Index, Index, Index, Index j) { return j < 128 || j >= 256; });
  for (Index key = 128; key < 256; key += 37) testing::poison_key(in, key);
  Options options = in.options;
  options.block_mask = mask;
  testing::for_each_target([&] {
    const Result got = forward_floats(in, options);
    const float* context = got.context.data_as<float>();
    EXPECT_TRUE(std::all_of(context, context + got.context.numel(),
                            [](float x) { return std::isfinite(x); }));
  });
}

// Packed sequences: entry s of the mask is sequence s, from its own first query and key.
TEST(BlockMaskKernels, PackedSequencesReadTheirOwnEntries) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    testing::Case c = shaped(1, 4, 2, 300, 300, 64, dtype);
    c.packed = true;
    testing::Inputs in = testing::make_inputs(c);
    const auto sequences = static_cast<Index>(in.options.cu_seqlens_q.size() - 1);
    ASSERT_GT(sequences, 1);
    std::vector<Index> prefixes;
    for (Index s = 0; s < sequences; ++s) prefixes.push_back(5 + 13 * s);
    Options options = in.options;
    options.block_mask = BlockMask::prefix_lm(prefixes, c.len_q, c.len_k, 16);
    Options reference = options;
    reference.backend = Backend::reference;
    const Result want = forward_floats(in, reference);
    testing::for_each_target([&] {
      const Result got = forward_floats(in, options);
      expect_close(got.context, want.context, kContextNmse, "context");
      expect_close(got.weights, want.weights, kContextNmse, "weights");
    });
    // Sequence s alone, with entry s of the mask as a dense one, gives the same weights.
    for (Index s = 0; s < sequences; ++s) {
      const Index q0 = in.options.cu_seqlens_q[static_cast<std::size_t>(s)];
      const Index k0 = in.options.cu_seqlens_k[static_cast<std::size_t>(s)];
      const Index len_q = in.options.cu_seqlens_q[static_cast<std::size_t>(s) + 1] - q0;
      const Index len_k = in.options.cu_seqlens_k[static_cast<std::size_t>(s) + 1] - k0;
      if (len_q == 0 || len_k == 0) continue;
      const Index prefix = prefixes[static_cast<std::size_t>(s)];
      Options alone;
      alone.block_mask = BlockMask::from_predicate(
          1, 1, len_q, len_k, [&](Index, Index, Index i, Index j) { return j < prefix || j <= i; },
          16);
      const Result one = forward(in.q.rows(q0, len_q), in.k.rows(k0, len_k), in.v.rows(k0, len_k),
                                 alone, {false, true});
      const Result packed = forward(in.q, in.k, in.v, options, {false, true});
      Index mismatches = 0;
      for (Index h = 0; h < c.heads_q; ++h) {
        for (Index i = 0; i < len_q; ++i) {
          const float* a =
              packed.weights.data_as<float>() + ((h * c.len_q) + q0 + i) * c.len_k + k0;
          const float* b = one.weights.data_as<float>() + (h * len_q + i) * len_k;
          mismatches += std::memcmp(a, b, static_cast<std::size_t>(len_k) * sizeof(float)) != 0;
        }
      }
      EXPECT_EQ(mismatches, 0) << "sequence " << s;
    }
  }
}

TEST(BlockMaskKernels, RefusesMasksThatDoNotFit) {
  testing::Case c = shaped(2, 4, 2, 64, 96, 32, DType::f32);
  const testing::Inputs in = testing::make_inputs(c);
  const auto always = [](Index, Index, Index, Index) { return true; };
  Options options = in.options;
  options.block_mask = BlockMask::from_predicate(3, 1, 64, 96, always);
  expect_refused([&] { (void)forward(in.q, in.k, in.v, options); }, "block_mask");
  options.block_mask = BlockMask::from_predicate(1, 2, 64, 96, always);
  expect_refused([&] { (void)forward(in.q, in.k, in.v, options); }, "block_mask");
  options.block_mask = BlockMask::from_predicate(1, 1, 64, 97, always);
  expect_refused([&] { (void)forward(in.q, in.k, in.v, options); }, "block_mask");
  options.block_mask = BlockMask::from_predicate(2, 4, 64, 96, always);
  Tensor dense(DType::boolean, {1, 1, 64, 96});
  options.mask = dense.view();
  expect_refused([&] { (void)forward(in.q, in.k, in.v, options); }, "block_mask");
}

}  // namespace
}  // namespace attn
