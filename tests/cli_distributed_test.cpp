// `mpirun -np N attn run --distributed`, end to end: the files that N ranks write together
// must hold what one process computes (attn::forward), in the layout and rank of the
// inputs, the same bytes on every run, with no temporary file left; a bad input exits 2
// with one line, printed once (by rank 0), and writes nothing.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "io/npy.hpp"
#include "support/cases.hpp"
#include "support/cli_files.hpp"
#include "support/command.hpp"
#include "support/temp_dir.hpp"

namespace attn {
namespace {

using io::Shape;
using testing::expect_close;
using testing::Outcome;
using testing::quoted;
using testing::TempDir;
using testing::view_of;

Outcome run_ranks(int ranks, const std::string& arguments, const TempDir& workdir) {
  return testing::run_in(workdir, quoted(ATTN_MPIEXEC) + " -np " + std::to_string(ranks) +
                                      " --oversubscribe --allow-run-as-root --bind-to none " +
                                      quoted(ATTN_CLI_PATH) + " run --distributed " + arguments);
}

// Writes a case's stored (file-order) inputs and, where the case has them, its ALiBi
// slopes and sinks; returns the arguments that name them.
std::string write_inputs(const TempDir& dir, const testing::Inputs& in) {
  const auto write = [&](const std::string& name, const Tensor& t) {
    const Dims d = t.shape();
    io::write_npy(dir.file(name), t.view(), {d[0], d[1], d[2], d[3]});
    return dir.file(name);
  };
  const auto write_vector = [&](const std::string& name, const std::vector<float>& values) {
    const auto n = static_cast<Index>(values.size());
    io::write_npy(dir.file(name), TensorView(values.data(), DType::f32, {1, 1, 1, n}), {n});
    return dir.file(name);
  };
  std::string args = "--query " + write("q.npy", in.q_storage) + " --key " +
                     write("k.npy", in.k_storage) + " --value " + write("v.npy", in.v_storage);
  if (!in.options.alibi_slopes.empty())
    args += " --alibi " + write_vector("a.npy", in.options.alibi_slopes);
  if (!in.options.sinks.empty()) args += " --sinks " + write_vector("s.npy", in.options.sinks);
  return args;
}

struct DistributedCase {
  std::string name;
  testing::Case c;
  std::string flags;  // what the case's options say, and the sharding
  std::vector<int> ranks;
};

std::vector<DistributedCase> distributed_cases() {
  using testing::Case;
  std::vector<DistributedCase> cases;
  Case plain;
  plain.batch = 2, plain.heads_q = plain.heads_kv = 2, plain.len_q = plain.len_k = 13;
  plain.dim = plain.dim_v = 8;
  // 13 rows over 3 or 4 ranks: uneven shares; over 4 of 3 rows, one rank holds 3 and
  // another 4.
  cases.push_back({"contiguous_uneven", plain, "", {1, 3, 4}});
  Case zigzag = plain;
  zigzag.len_q = zigzag.len_k = 24;
  zigzag.heads_q = 4;
  zigzag.dim_v = 5;
  zigzag.causal = true;
  zigzag.bshd = true;
  cases.push_back(
      {"zigzag_causal_gqa_bshd", zigzag, "--causal --layout bshd --sharding zigzag", {2, 3, 4}});
  Case shaped = plain;
  shaped.len_q = 6, shaped.len_k = 17;
  shaped.causal = true, shaped.align = CausalAlign::bottom_right;
  shaped.window = {5, 0}, shaped.softcap = 5.0, shaped.alibi = true, shaped.sinks = true;
  cases.push_back({"bottom_right_window_softcap_alibi_sinks",
                   shaped,
                   "--causal bottom-right --window 5,0 --softcap 5",
                   {2, 4}});
  Case wide = plain;
  wide.dtype = DType::f64;
  wide.len_q = wide.len_k = 3;  // fewer rows than ranks: the last rank holds none
  cases.push_back({"float64_fewer_rows_than_ranks", wide, "--scale 0.3 --backend reference", {4}});
  Case half = plain;
  half.dtype = DType::f16;
  cases.push_back({"float16", half, "--sharding contiguous", {2}});
  return cases;
}

TEST(CliDistributed, RanksWriteWhatOneProcessComputes) {
  for (const DistributedCase& dc : distributed_cases()) {
    for (const int ranks : dc.ranks) {
      SCOPED_TRACE(dc.name + " on " + std::to_string(ranks) + " ranks");
      const TempDir dir;
      testing::Inputs in = testing::make_inputs(dc.c);
      if (dc.flags.find("--scale") != std::string::npos) in.options.scale = 0.3;
      const std::string args = write_inputs(dir, in) + " --out c.npy --lse l.npy " + dc.flags;
      const Outcome outcome = run_ranks(ranks, args, dir);
      ASSERT_EQ(outcome.status, 0) << outcome.err;
      EXPECT_EQ(outcome.err, "");

      const Result want = forward(in.q, in.k, in.v, in.options, {.lse = true});
      const io::NpyArray context = io::read_npy(dir.file("c.npy"));
      const io::NpyArray lse = io::read_npy(dir.file("l.npy"));
      const testing::Case& c = dc.c;
      EXPECT_EQ(context.shape, c.bshd ? Shape({c.batch, c.len_q, c.heads_q, c.dim_v})
                                      : Shape({c.batch, c.heads_q, c.len_q, c.dim_v}));
      EXPECT_EQ(context.tensor.dtype(), c.dtype);
      EXPECT_EQ(lse.shape, (Shape{c.batch, c.heads_q, c.len_q}));
      expect_close(view_of(context, c.bshd), want.context.view(), "context");
      expect_close(TensorView(lse.tensor.data(), lse.tensor.dtype(), want.lse.shape()),
                   want.lse.view(), "lse");

      // Nothing but the inputs and the two outputs: no temporary file is left.
      for (const std::string& name : dir.entries()) {
        EXPECT_TRUE(name == "c.npy" || name == "l.npy" || name.size() == 5) << name;
      }
      // The same run again gives the same bytes.
      const std::string first = dir.read("c.npy");
      ASSERT_EQ(run_ranks(ranks, args, dir).status, 0);
      EXPECT_EQ(dir.read("c.npy"), first);
    }
  }
}

// 2-D [L, D] and 3-D [H, L, D] files: the outputs keep the query's rank.
TEST(CliDistributed, LowerRankFilesKeepTheirRank) {
  testing::Case c;
  c.heads_q = c.heads_kv = 3, c.len_q = 8, c.len_k = 6, c.dim = 5, c.dim_v = 2;
  const testing::Inputs in = testing::make_inputs(c);
  const TempDir dir;
  io::write_npy(dir.file("q.npy"), in.q, {3, 8, 5});
  io::write_npy(dir.file("k.npy"), in.k, {3, 6, 5});
  io::write_npy(dir.file("v.npy"), in.v, {3, 6, 2});
  const Outcome outcome =
      run_ranks(2, "--query q.npy --key k.npy --value v.npy --out c.npy --lse l.npy", dir);
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  const io::NpyArray context = io::read_npy(dir.file("c.npy"));
  EXPECT_EQ(context.shape, (Shape{3, 8, 2}));
  EXPECT_EQ(io::read_npy(dir.file("l.npy")).shape, (Shape{3, 8}));
  expect_close(context.tensor.view(), forward(in.q, in.k, in.v).context.view(), "3-D context");

  testing::Case single = c;
  single.heads_q = single.heads_kv = 1;
  const testing::Inputs one_head = testing::make_inputs(single);
  const TempDir flat;
  io::write_npy(flat.file("q.npy"), one_head.q, {8, 5});
  io::write_npy(flat.file("k.npy"), one_head.k, {6, 5});
  io::write_npy(flat.file("v.npy"), one_head.v, {6, 2});
  const Outcome two_d = run_ranks(3, "--query q.npy --key k.npy --value v.npy --out c.npy", flat);
  ASSERT_EQ(two_d.status, 0) << two_d.err;
  const io::NpyArray flat_context = io::read_npy(flat.file("c.npy"));
  EXPECT_EQ(flat_context.shape, (Shape{8, 2}));
  expect_close(flat_context.tensor.view(),
               forward(one_head.q, one_head.k, one_head.v).context.view(), "2-D context");
}

// Each bad input: exit 2, one line "attn: error: ..." holding `expected` (from rank 0 only,
// however many ranks), and no file written.
void expect_error(int ranks, const std::string& arguments, const std::string& expected) {
  SCOPED_TRACE(arguments);
  const std::vector<float> values(2 * 12 * 4, 0.5f);
  const TempDir dir;
  for (const char* name : {"q.npy", "k.npy", "v.npy", "m.npy"})
    io::write_npy(dir.file(name), TensorView(values.data(), DType::f32, {1, 2, 12, 4}),
                  {1, 2, 12, 4});
  io::write_npy(dir.file("d3.npy"), TensorView(values.data(), DType::f32, {1, 2, 12, 3}),
                {1, 2, 12, 3});
  const std::vector<std::string> before = dir.entries();
  const Outcome outcome = run_ranks(ranks, arguments, dir);
  EXPECT_EQ(outcome.status, 2) << outcome.err;
  // mpirun adds its own notice of a rank's exit status; attn's own lines start "attn: ".
  std::vector<std::string> lines;
  std::istringstream err(outcome.err);
  for (std::string line; std::getline(err, line);) {
    if (line.rfind("attn: ", 0) == 0) lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 1u) << outcome.err;
  EXPECT_EQ(lines[0].rfind("attn: error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(expected), std::string::npos) << lines[0];
  EXPECT_EQ(dir.entries(), before);
}

TEST(CliDistributed, BadInputsExitOnceOnEveryRankAndWriteNothing) {
  const std::string inputs = "--query q.npy --key k.npy --value v.npy --out c.npy";
  expect_error(4, inputs + " --sharding zigzag",
               "rank 0: --query: expected a sequence length divisible by 8 (2 x 4 ranks) for "
               "--sharding zigzag, given 12");
  expect_error(2, "--query q.npy --key missing.npy --value v.npy --out c.npy",
               "rank 0: missing.npy: cannot open");
  expect_error(2, inputs + " --mask m.npy", "--mask: expected no mask with --distributed");
  expect_error(2, inputs + " --weights w.npy", "--weights: expected no --weights");
  expect_error(2, inputs + " --contributions n.npy",
               "--contributions: expected no --contributions");
  expect_error(2, inputs + " --viz w.svg", "--viz: expected no --viz");
  expect_error(2, inputs + " --lse c.npy", "--lse: expected a path different from --out");
  expect_error(2, "--query q.npy --key k.npy --value v.npy --out .", "expected a regular file");
  // Checked by attn::dist::forward on every rank, then agreed.
  expect_error(2, "--query q.npy --key d3.npy --value v.npy --out c.npy", "rank 0: k:");
}

TEST(CliDistributed, ShardingNeedsDistributed) {
  const TempDir dir;
  const Outcome outcome =
      testing::run_in(dir, quoted(ATTN_CLI_PATH) +
                               " run --query q.npy --key k.npy --value v.npy --out c.npy "
                               "--sharding zigzag");
  EXPECT_EQ(outcome.status, 2);
  EXPECT_EQ(outcome.err, "attn: error: --sharding: expected only with --distributed\n");
}

}  // namespace
}  // namespace attn
