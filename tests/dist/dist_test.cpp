// attn::dist on however many ranks mpirun started (ctest runs 1 to 4): each rank builds the
// same global inputs from the same seed, passes its shard, and checks its rows against
// single-process attn::forward and the float64 reference. Tests only check after the
// collective calls, so a failed expectation on one rank cannot leave the others waiting.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/dist.hpp"
#include "core/rows.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/error_message.hpp"

namespace attn::testing {
namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// First row of rank r's run of `len` rows: even runs, or runs growing with r (uneven, and
// empty for the first ranks of a short sequence).
Index even_boundary(Index len, Index r, Index ranks) {
  return len * r / ranks;
}
Index uneven_boundary(Index len, Index r, Index ranks) {
  return len * r * r / (ranks * ranks);
}

// Rows [first, first + count) of each piece of t, one after another, as one contiguous tensor.
Tensor concatenated_rows(const TensorView& t, const std::vector<std::pair<Index, Index>>& pieces) {
  Index rows = 0;
  for (const auto& [first, count] : pieces) rows += count;
  Tensor out(t.dtype, {t.shape[0], t.shape[1], rows, t.shape[3]});
  const std::size_t row = static_cast<std::size_t>(t.shape[3]) * dtype_size(t.dtype);
  const auto element = static_cast<Index>(dtype_size(t.dtype));
  auto* to = static_cast<std::byte*>(out.data());
  for (Index b = 0; b < t.shape[0]; ++b)
    for (Index h = 0; h < t.shape[1]; ++h)
      for (const auto& [first, count] : pieces)
        for (Index s = first; s < first + count; ++s, to += row) {
          const Index at = (b * t.strides[0] + h * t.strides[1] + s * t.strides[2]) * element;
          std::memcpy(to, static_cast<const std::byte*>(t.data) + at, row);
        }
  return out;
}

// This rank's pieces of a sequence of `len` rows.
std::vector<std::pair<Index, Index>> my_pieces(dist::Sharding sharding, Index len, bool keys) {
  const Index r = world_rank(), n = world_size();
  if (sharding == dist::Sharding::zigzag) {
    const Index chunk = len / (2 * n);
    return {{r * chunk, chunk}, {(2 * n - 1 - r) * chunk, chunk}};
  }
  const auto boundary = keys ? uneven_boundary : even_boundary;
  const Index first = boundary(len, r, n);
  return {{first, boundary(len, r + 1, n) - first}};
}

// The largest |got - want| over all elements, in units of want's spacing in the half
// dtype (2^-10 |want| for float16, 2^-7 |want| for bfloat16), or of 2^-20 near zero, where
// float32's own error (about 1e-7 of the values summed) spans several float16 subnormals:
// 1 means neighbours.
double half_steps_apart(const Tensor& got, const Tensor& want, DType dtype) {
  const double relative = dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
  double worst = 0.0;
  const Dims& shape = want.shape();
  for (Index b = 0; b < shape[0]; ++b)
    for (Index h = 0; h < shape[1]; ++h)
      for (Index s = 0; s < shape[2]; ++s)
        for (Index d = 0; d < shape[3]; ++d) {
          const double g = core::load_element(got.view(), b, h, s, d);
          const double w = core::load_element(want.view(), b, h, s, d);
          worst = std::max(worst, std::abs(g - w) / std::max(relative * std::abs(w), 0x1p-20));
        }
  return worst;
}

// The float64 reference's context and lse for this rank's query pieces only, each piece
// computed alone with the offset that places it (bit for bit the whole's rows:
// tests/position_offset_test.cpp), so that no rank computes every row.
std::pair<Tensor, Tensor> reference_rows(const Case& c, const Inputs& in,
                                         const std::vector<std::pair<Index, Index>>& pieces) {
  Index rows = 0;
  for (const auto& piece : pieces) rows += piece.second;
  std::pair<Tensor, Tensor> out{Tensor(DType::f64, {c.batch, c.heads_q, rows, c.dim_v}),
                                Tensor(DType::f64, {c.batch, c.heads_q, rows, 1})};
  Options options = in.options;
  options.backend = Backend::reference;
  options.causal_align = CausalAlign::top_left;
  const Index shift = c.align == CausalAlign::bottom_right ? c.len_k - c.len_q : 0;
  Index local = 0;
  for (const auto& [first, count] : pieces) {
    options.position_offset = first + shift;
    forward_into(in.q.rows(first, count), in.k, in.v, options,
                 {out.first.mutable_view().rows(local, count),
                  out.second.mutable_view().rows(local, count),
                  {}});
    local += count;
  }
  return out;
}

// The fast kernel's bounds against float64 (tests/cpu_forward_test.cpp), and a max abs
// bound on contexts of standard normal values.
constexpr double kContextNmse = 2e-12, kAlibiContextNmse = 1e-11;
constexpr double kContextMaxAbs = 1e-5, kLseMaxAbs = 2e-5;

struct DistCase {
  Case c;
  dist::Sharding sharding;
};

std::vector<DistCase> dist_cases() {
  const Index n = world_size();
  std::vector<DistCase> out;
  std::set<std::string> zigzag_names;
  for (const Case& c : case_list()) {
    if (c.mask != MaskCase::none || c.packed || c.position_bias) continue;
    out.push_back({c, dist::Sharding::contiguous});
    // Zigzag changes which rows meet which keys: it matters where positions do.
    if (!c.causal && c.window.left < 0 && c.window.right < 0 && !c.alibi) continue;
    Case zigzag = c;
    zigzag.len_q = (c.len_q + 2 * n - 1) / (2 * n) * (2 * n);
    zigzag.len_k = (c.len_k + 2 * n - 1) / (2 * n) * (2 * n);
    // Rounding up can turn two lengths into one (1 and 3 into 6 on 3 ranks).
    if (zigzag_names.insert(zigzag.name()).second) out.push_back({zigzag, dist::Sharding::zigzag});
  }
  return out;
}

std::string dist_case_name(const ::testing::TestParamInfo<DistCase>& info) {
  return info.param.c.name() +
         (info.param.sharding == dist::Sharding::zigzag ? "_zigzag" : "_contiguous");
}

class DistForward : public ::testing::TestWithParam<DistCase> {};

// The local rows match the whole's as closely as single-process forward's rows do, and a
// second run gives the same bytes.
TEST_P(DistForward, MatchesSingleProcessForward) {
  const auto& [c, sharding] = GetParam();
  const Inputs in = make_inputs(c);
  const Result single = forward(in.q, in.k, in.v, in.options, {.lse = true});

  const auto q_pieces = my_pieces(sharding, c.len_q, false);
  const auto k_pieces = my_pieces(sharding, c.len_k, true);
  // A contiguous shard is a view into the inputs (strided for BSHD cases); a zigzag shard a copy.
  Tensor q_copy, k_copy, v_copy;
  TensorView q = in.q.rows(q_pieces[0].first, q_pieces[0].second);
  TensorView k = in.k.rows(k_pieces[0].first, k_pieces[0].second);
  TensorView v = in.v.rows(k_pieces[0].first, k_pieces[0].second);
  if (sharding == dist::Sharding::zigzag) {
    q_copy = concatenated_rows(in.q, q_pieces), q = q_copy.view();
    k_copy = concatenated_rows(in.k, k_pieces), k = k_copy.view();
    v_copy = concatenated_rows(in.v, k_pieces), v = v_copy.view();
  }
  const Result got = dist::forward(MPI_COMM_WORLD, q, k, v, in.options, sharding);
  const Result again = dist::forward(MPI_COMM_WORLD, q, k, v, in.options, sharding);

  ASSERT_EQ(got.context.nbytes(), again.context.nbytes());
  EXPECT_EQ(std::memcmp(got.context.data(), again.context.data(), got.context.nbytes()), 0);
  EXPECT_EQ(std::memcmp(got.lse.data(), again.lse.data(), got.lse.nbytes()), 0);
  const auto [ref_rows, ref_lse] = reference_rows(c, in, q_pieces);
  const Tensor single_rows = concatenated_rows(single.context.view(), q_pieces);
  const Tensor single_lse = concatenated_rows(single.lse.view(), q_pieces);
  ASSERT_EQ(got.context.shape(), ref_rows.shape());
  ASSERT_EQ(got.lse.shape(), ref_lse.shape());
  if (got.context.numel() == 0) return;

  if (c.dtype == DType::f16 || c.dtype == DType::bf16) {
    // Both round a float32 context to the half type: where the float32 values differ in
    // their last bits the two may round to neighbours, never further apart.
    EXPECT_LE(half_steps_apart(got.context, single_rows, c.dtype), 1.0);
  } else {
    const Comparison mine = compare(got.context.view(), ref_rows.view());
    const Comparison theirs = compare(single_rows.view(), ref_rows.view());
    EXPECT_TRUE(mine.hard_failure.empty()) << describe(mine);
    // Merging per block rounds a little differently from one kernel call: within 4x of
    // single-process forward's error, or within the bounds that forward itself is held to
    // (tests/cpu_forward_test.cpp), which matter where a rank's few rows make its own
    // figure tiny. A wrong position or a lost block shows as an NMSE of 1e-3 or more.
    const double nmse_floor = c.alibi ? kAlibiContextNmse : kContextNmse;
    EXPECT_LE(mine.nmse, std::max(4.0 * theirs.nmse, nmse_floor))
        << describe(mine) << " vs " << describe(theirs);
    EXPECT_LE(mine.max_abs, std::max(4.0 * theirs.max_abs, kContextMaxAbs))
        << describe(mine) << " vs " << describe(theirs);
  }
  const Comparison lse = compare(got.lse.view(), ref_lse.view());
  const Comparison single_lse_error = compare(single_lse.view(), ref_lse.view());
  EXPECT_TRUE(lse.hard_failure.empty()) << describe(lse);
  EXPECT_LE(lse.max_abs, std::max(4.0 * single_lse_error.max_abs, kLseMaxAbs)) << describe(lse);
}

INSTANTIATE_TEST_SUITE_P(Cases, DistForward, ::testing::ValuesIn(dist_cases()), dist_case_name);

// Every rank's message, and whether they are all equal to `expected`.
bool every_rank_says(const std::string& message, const std::string& expected) {
  int mine = message == expected ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all == 1;
}

Case small_case() {
  Case c;
  c.heads_q = 4, c.heads_kv = 2, c.len_q = 16, c.len_k = 16, c.dim = 8, c.dim_v = 8;
  c.causal = true;
  return c;
}

TEST(DistForwardErrors, BadShapeOnTheLastRankOnlyThrowsTheSameOnEveryRank) {
  Case bad = small_case();
  bad.dim = 9;
  const Inputs good_in = make_inputs(small_case()), bad_in = make_inputs(bad);
  const int last = world_size() - 1;
  const TensorView k = world_rank() == last ? bad_in.k : good_in.k;
  const std::string message = error_message(
      [&] { dist::forward(MPI_COMM_WORLD, good_in.q, k, good_in.v, good_in.options); });
  const std::string local = error_message([&] { forward(good_in.q, bad_in.k, good_in.v); });
  EXPECT_TRUE(every_rank_says(message, "rank " + std::to_string(last) + ": " + local)) << message;
}

// An arbitrary dense mask, packed sequences and dropout.
TEST(DistForwardErrors, WhatCannotBeShardedIsRefusedOnEveryRank) {
  Case mask = small_case(), packed = small_case(), dropout = small_case();
  mask.mask = MaskCase::boolean;
  packed.packed = true;
  dropout.dropout = 0.1;
  const std::pair<Case, std::string> refusals[] = {
      {mask,
       "rank 0: mask: expected none (an arbitrary dense mask cannot be split over ranks), "
       "given a mask"},
      {packed,
       "rank 0: cu_seqlens: expected none (packed sequences cannot be split over ranks), "
       "given offsets"},
      {dropout, "rank 0: dropout_p: expected 0 (ring attention serves inference), given 0.100000"}};
  for (const auto& [c, expected] : refusals) {
    const Inputs in = make_inputs(c);
    const std::string message =
        error_message([&] { dist::forward(MPI_COMM_WORLD, in.q, in.k, in.v, in.options); });
    EXPECT_TRUE(every_rank_says(message, expected)) << message;
  }
}

TEST(DistForwardErrors, OptionsThatDifferOnOneRankThrowTheSameOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks to differ";
  const Inputs in = make_inputs(small_case());
  Options options = in.options;
  if (world_rank() == 1) options.window = {3, -1};
  const std::string message =
      error_message([&] { dist::forward(MPI_COMM_WORLD, in.q, in.k, in.v, options); });
  EXPECT_TRUE(every_rank_says(message, "rank 1: window.left: expected -1 (as on rank 0), given 3"))
      << message;
}

TEST(DistForwardErrors, ZigzagNeedsAnEvenRowCount) {
  Case c = small_case();
  c.len_q = 15;
  const Inputs in = make_inputs(c);
  const std::string message = error_message(
      [&] { dist::forward(MPI_COMM_WORLD, in.q, in.k, in.v, in.options, dist::Sharding::zigzag); });
  EXPECT_TRUE(every_rank_says(
      message,
      "rank 0: q_local: expected an even row count (two equal zigzag chunks), given "
      "shape [1, 4, 15, 8]"))
      << message;
}

// Ranks' step records: N steps, and on one rank the last step receives nothing.
TEST(DistForwardSteps, OneRecordPerRingStep) {
  const Inputs in = make_inputs(small_case());
  std::vector<dist::RingStep> steps;
  dist::forward(MPI_COMM_WORLD, in.q, in.k, in.v, in.options, dist::Sharding::contiguous, &steps);
  ASSERT_EQ(steps.size(), static_cast<std::size_t>(world_size()));
  EXPECT_TRUE(steps[0].computed);
  EXPECT_EQ(steps.back().block_bytes, 0);
  for (const dist::RingStep& s : steps) EXPECT_GE(s.wait_seconds, 0.0);
}

// A causal window of 8 keys over shards of 64 rows: rank r sees only its own keys and
// those of rank r - 1, so each rank computes on at most two blocks and receives only its
// predecessor's; the result still matches single-process forward.
TEST(DistForwardSteps, BlocksAWindowHidesAreNeitherComputedNorSent) {
  const Index shard = 64, r = world_rank(), n = world_size();
  Case c;
  c.heads_q = 2, c.heads_kv = 2, c.len_q = shard * n, c.len_k = shard * n, c.dim = 8;
  c.dim_v = 8, c.causal = true, c.window = {8, 0};
  const Inputs in = make_inputs(c);
  std::vector<dist::RingStep> steps;
  const Result got =
      dist::forward(MPI_COMM_WORLD, in.q.rows(r * shard, shard), in.k.rows(r * shard, shard),
                    in.v.rows(r * shard, shard), in.options, dist::Sharding::contiguous, &steps);
  const Result single = forward(in.q, in.k, in.v, in.options, {.lse = true});
  ASSERT_EQ(steps.size(), static_cast<std::size_t>(n));
  for (Index t = 0; t < n; ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    const auto& step = steps[static_cast<std::size_t>(t)];
    EXPECT_EQ(step.computed, t == 0 || (t == 1 && r > 0));
    EXPECT_EQ(step.block_bytes > 0, t == 0 && r > 0);
  }
  const Tensor want = concatenated_rows(single.context.view(), {{r * shard, shard}});
  const Comparison cc = compare(got.context.view(), want.view());
  EXPECT_LT(cc.max_abs, 1e-5) << describe(cc);
}

// Sequence s of the global context of `len` tokens: rank r's range, by position.
struct DecodeSetup {
  KVCache cache{KVCacheConfig{
      .heads_kv = 2, .dim = 16, .dim_v = 12, .page_size = 8, .dtype = CacheDType::f32}};
  KVCache whole{KVCacheConfig{
      .heads_kv = 2, .dim = 16, .dim_v = 12, .page_size = 8, .dtype = CacheDType::f32}};
  std::vector<KVCache::SequenceId> ids, whole_ids;
  Tensor q;
};

DecodeSetup decode_setup(const std::vector<Index>& lengths, Index n_q) {
  DecodeSetup d;
  const Index r = world_rank(), n = world_size();
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    Case c;
    c.heads_q = 4, c.heads_kv = 2, c.len_q = n_q, c.len_k = lengths[s], c.dim = 16, c.dim_v = 12;
    const Inputs in = make_inputs(c, static_cast<unsigned>(s + 7));
    d.ids.push_back(d.cache.add_sequence());
    d.whole_ids.push_back(d.whole.add_sequence());
    const Index first = uneven_boundary(lengths[s], r, n),
                end = uneven_boundary(lengths[s], r + 1, n);
    d.cache.append(d.ids.back(), in.k.rows(first, end - first), in.v.rows(first, end - first));
    d.whole.append(d.whole_ids.back(), in.k, in.v);
    if (s == 0) d.q = Tensor(DType::f32, {static_cast<Index>(lengths.size()), 4, n_q, 16});
    std::memcpy(static_cast<float*>(d.q.data()) + static_cast<Index>(s) * 4 * n_q * 16, in.q.data,
                static_cast<std::size_t>(4 * n_q * 16) * sizeof(float));
  }
  return d;
}

TEST(DistDecode, MatchesSingleProcessDecodeOnEveryRank) {
  DecodeSetup d = decode_setup({37, 50, 3}, 2);
  const int root = world_size() - 1;
  for (const bool causal : {false, true}) {
    Options options;
    options.causal = causal;
    options.window = {30, -1};
    options.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    options.sinks = {0.5f, -1.0f, 0.0f, 2.0f};
    options.softcap = 20.0;
    const TensorView q = world_rank() == root ? d.q.view() : TensorView();
    const Decoded got = dist::decode(MPI_COMM_WORLD, q, d.cache, d.ids, options, root);
    const Decoded again = dist::decode(MPI_COMM_WORLD, q, d.cache, d.ids, options, root);
    const Decoded want = decode(d.q.view(), d.whole, d.whole_ids, options);
    const Comparison cc = compare(got.context.view(), want.context.view());
    EXPECT_TRUE(cc.hard_failure.empty()) << describe(cc);
    EXPECT_LT(cc.nmse, 1e-11) << describe(cc);
    const Comparison l = compare(got.lse.view(), want.lse.view());
    EXPECT_LT(l.max_abs, 2e-5) << describe(l);
    EXPECT_EQ(std::memcmp(got.context.data(), again.context.data(), got.context.nbytes()), 0);
    // Rank 0's bytes on every rank.
    std::vector<unsigned char> rank0(got.context.nbytes());
    std::memcpy(rank0.data(), got.context.data(), rank0.size());
    MPI_Bcast(rank0.data(), static_cast<int>(rank0.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
    EXPECT_EQ(std::memcmp(rank0.data(), got.context.data(), rank0.size()), 0);
  }
}

TEST(DistDecodeErrors, BadQueryOnTheRootThrowsTheSameOnEveryRank) {
  DecodeSetup d = decode_setup({20}, 1);
  Tensor bad(DType::f32, {1, 4, 1, 15});
  const TensorView q = world_rank() == 0 ? bad.view() : TensorView();
  const std::string message =
      error_message([&] { dist::decode(MPI_COMM_WORLD, q, d.cache, d.ids); });
  EXPECT_NE(message, "no error");
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string rank0 = message;
  rank0.resize(static_cast<std::size_t>(length));
  MPI_Bcast(rank0.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(message, rank0);
  EXPECT_NE(message.find("q: expected shape [1 (one per seq_id), Hq, n_q, 16"), std::string::npos)
      << message;
}

TEST(DistDecodeErrors, UnknownSequenceOnTheLastRankOnlyThrowsTheSameOnEveryRank) {
  DecodeSetup d = decode_setup({20}, 1);
  const int last = world_size() - 1;
  std::vector<KVCache::SequenceId> ids = d.ids;
  if (world_rank() == last) ids[0] = 99;
  const std::string message =
      error_message([&] { dist::decode(MPI_COMM_WORLD, d.q.view(), d.cache, ids); });
  const std::string local = error_message([&] { d.cache.read({99}, "seq_ids"); });
  EXPECT_TRUE(every_rank_says(message, "rank " + std::to_string(last) + ": " + local)) << message;
}

}  // namespace
}  // namespace attn::testing
