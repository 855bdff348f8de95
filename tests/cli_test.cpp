// The attn command end to end: the built binary on small .npy files. Results must equal
// attn::forward on the same arrays; every kind of bad input must exit 2 with exactly one
// line on stderr and leave no output file behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
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
using testing::TempDir;
using testing::view_of;

using testing::Outcome;
using testing::quoted;

// Runs `attn <arguments>` in `workdir` (testing::run_in); `shell` runs first in the same
// shell (e.g. a ulimit).
Outcome run_attn(const std::string& arguments, const TempDir& workdir,
                 const std::string& shell = "true") {
  return testing::run_in(workdir, shell + " && " + quoted(ATTN_CLI_PATH) + " " + arguments);
}

// Starts `attn <arguments>` in `workdir` without waiting for it; its output is discarded.
pid_t start_attn(const std::vector<std::string>& arguments, const TempDir& workdir) {
  std::vector<std::string> words = {ATTN_CLI_PATH};
  words.insert(words.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    if (::chdir(workdir.path().c_str()) != 0 || null < 0) ::_exit(127);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

bool holds_staged_file(const TempDir& dir) {
  for (const std::string& name : dir.entries()) {
    if (name.find(".attn-tmp-") != std::string::npos) return true;
  }
  return false;
}

Shape shape_of(const Dims& dims) {
  return {dims[0], dims[1], dims[2], dims[3]};
}

// The stored (file-order) dims of a case input: [B, S, H, D] for bshd.
std::string write_storage(const TempDir& dir, const std::string& name, const Tensor& storage) {
  io::write_npy(dir.file(name), storage.view(), shape_of(storage.shape()));
  return dir.file(name);
}

testing::Case sized(Index batch, Index heads, Index len_q, Index len_k, Index dim, Index dim_v) {
  testing::Case c;
  c.batch = batch;
  c.heads_q = c.heads_kv = heads;
  c.len_q = len_q;
  c.len_k = len_k;
  c.dim = dim;
  c.dim_v = dim_v;
  return c;
}

struct RunCase {
  std::string name;
  testing::Case c;
  std::string flags;  // the options that say what c's options say
};

std::vector<RunCase> run_cases() {
  using testing::Case;
  using testing::MaskCase;
  std::vector<RunCase> cases;
  Case plain = sized(2, 2, 5, 7, 8, 8);
  cases.push_back({"plain", plain, ""});
  Case gqa = plain;
  gqa.heads_q = 4;
  gqa.heads_kv = 2;
  gqa.dim_v = 3;
  cases.push_back({"gqa", gqa, ""});
  Case bottom_right = plain;
  bottom_right.causal = true;
  bottom_right.align = CausalAlign::bottom_right;
  cases.push_back({"causal_bottom_right", bottom_right, "--causal=bottom-right"});
  Case top_left = plain;
  top_left.causal = true;
  cases.push_back({"causal_bare", top_left, "--causal"});
  Case boolean_mask = plain;
  boolean_mask.mask = MaskCase::boolean;
  cases.push_back({"mask_bool", boolean_mask, ""});
  Case additive_mask = plain;
  additive_mask.mask = MaskCase::additive;
  cases.push_back({"mask_additive", additive_mask, ""});
  Case shaped = plain;
  shaped.window = {2, 1};
  shaped.softcap = 5.0;
  shaped.alibi = true;
  shaped.sinks = true;
  cases.push_back({"window_softcap_alibi_sinks", shaped, "--window 2,1 --softcap 5"});
  Case bshd = gqa;
  bshd.bshd = true;
  bshd.causal = true;
  cases.push_back({"bshd", bshd, "--layout bshd --causal top-left"});
  Case half = plain;
  half.dtype = DType::f16;
  cases.push_back({"float16", half, ""});
  Case wide = plain;
  wide.dtype = DType::f64;
  cases.push_back({"float64", wide, "--scale 0.3 --threads 1 --backend reference"});
  return cases;
}

TEST(Cli, RunMatchesForward) {
  for (const RunCase& rc : run_cases()) {
    SCOPED_TRACE(rc.name);
    const TempDir dir;
    testing::Inputs in = testing::make_inputs(rc.c);
    if (rc.flags.find("--scale") != std::string::npos) in.options.scale = 0.3;
    std::string args = "run --query " + write_storage(dir, "q.npy", in.q_storage) + " --key " +
                       write_storage(dir, "k.npy", in.k_storage) + " --value " +
                       write_storage(dir, "v.npy", in.v_storage) + " --out " + dir.file("c.npy") +
                       " --weights " + dir.file("w.npy") + " --lse " + dir.file("l.npy") + " " +
                       rc.flags;
    if (in.options.mask) args += " --mask " + write_storage(dir, "m.npy", in.mask_storage);
    const auto write_vector = [&](const std::string& name, const std::vector<float>& values) {
      const auto n = static_cast<Index>(values.size());
      io::write_npy(dir.file(name), TensorView(values.data(), DType::f32, {1, 1, 1, n}), {n});
      return dir.file(name);
    };
    if (!in.options.alibi_slopes.empty())
      args += " --alibi " + write_vector("a.npy", in.options.alibi_slopes);
    if (!in.options.sinks.empty()) args += " --sinks " + write_vector("s.npy", in.options.sinks);

    const Outcome outcome = run_attn(args, dir);
    ASSERT_EQ(outcome.status, 0) << outcome.err;
    EXPECT_EQ(outcome.err, "");

    const Result want = forward(in.q, in.k, in.v, in.options, {.lse = true, .weights = true});
    const io::NpyArray context = io::read_npy(dir.file("c.npy"));
    const io::NpyArray lse = io::read_npy(dir.file("l.npy"));
    const io::NpyArray weights = io::read_npy(dir.file("w.npy"));
    const testing::Case& c = rc.c;
    const Shape context_shape = c.bshd ? Shape{c.batch, c.len_q, c.heads_q, c.dim_v}
                                       : Shape{c.batch, c.heads_q, c.len_q, c.dim_v};
    EXPECT_EQ(context.shape, context_shape);
    EXPECT_EQ(context.tensor.dtype(), c.dtype);
    EXPECT_EQ(lse.shape, (Shape{c.batch, c.heads_q, c.len_q}));
    EXPECT_EQ(weights.shape, (Shape{c.batch, c.heads_q, c.len_q, c.len_k}));
    EXPECT_EQ(weights.tensor.dtype(), c.dtype == DType::f64 ? DType::f64 : DType::f32);
    expect_close(view_of(context, c.bshd), want.context.view(), "context");
    expect_close(TensorView(lse.tensor.data(), lse.tensor.dtype(), want.lse.shape()),
                 want.lse.view(), "lse");
    expect_close(weights.tensor.view(), want.weights.view(), "weights");
  }
}

// float64 files run the float64 reference: at --backend auto the command says so, once, on
// stderr (attn::set_fallback_notice's default); asked for, it says nothing.
TEST(Cli, TheReferenceIsNeverASilentFallback) {
  testing::Case c;
  c.heads_q = 2, c.heads_kv = 2, c.len_q = 5, c.len_k = 7, c.dim = 8, c.dim_v = 8;
  c.dtype = DType::f64;
  const TempDir dir;
  const testing::Inputs in = testing::make_inputs(c);
  const std::string args = "run --query " + write_storage(dir, "q.npy", in.q_storage) + " --key " +
                           write_storage(dir, "k.npy", in.k_storage) + " --value " +
                           write_storage(dir, "v.npy", in.v_storage) + " --out " +
                           dir.file("c.npy") + " --weights " + dir.file("w.npy");
  const Outcome automatic = run_attn(args, dir);
  ASSERT_EQ(automatic.status, 0) << automatic.err;
  EXPECT_EQ(automatic.err,
            "attn: running the float64 reference, which is far slower: the fast CPU kernel does "
            "not serve float64 inputs (it computes in float32); ask for backend reference to "
            "run it without this notice (explain says why before a call)\n");
  const Outcome asked = run_attn(args + " --backend reference", dir);
  ASSERT_EQ(asked.status, 0) << asked.err;
  EXPECT_EQ(asked.err, "");
}

// 2-D [L, D] and 3-D [H, L, D] files: leading dims of 1, and outputs of the query's rank.
// --contributions writes alpha_ij ||v_j|| beside the weights; --viz-show contributions
// draws that array, the same picture as `attn viz` of the written file.
TEST(Cli, ContributionsAreTheWeightsTimesTheValueNorms) {
  const TempDir dir;
  const testing::Case c = sized(1, 2, 4, 6, 5, 3);
  const testing::Inputs in = testing::make_inputs(c);
  io::write_npy(dir.file("q.npy"), in.q, {1, 2, 4, 5});
  io::write_npy(dir.file("k.npy"), in.k, {1, 2, 6, 5});
  io::write_npy(dir.file("v.npy"), in.v, {1, 2, 6, 3});
  const Outcome outcome = run_attn(
      "run --query q.npy --key k.npy --value v.npy --out c.npy --causal --weights w.npy "
      "--contributions n.npy --viz n.svg --viz-show contributions --viz-head 1",
      dir);
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  const io::NpyArray weights = io::read_npy(dir.file("w.npy"));
  const io::NpyArray contributed = io::read_npy(dir.file("n.npy"));
  ASSERT_EQ(contributed.shape, (Shape{1, 2, 4, 6}));
  const io::NpyArray value = io::read_npy(dir.file("v.npy"));
  for (Index h = 0; h < 2; ++h) {
    for (Index i = 0; i < 4; ++i) {
      for (Index j = 0; j < 6; ++j) {
        double norm = 0.0;
        for (Index d = 0; d < 3; ++d) {
          const double x = value.tensor.data_as<float>()[(h * 6 + j) * 3 + d];
          norm += x * x;
        }
        const Index at = (h * 4 + i) * 6 + j;
        const double want = weights.tensor.data_as<float>()[at] * std::sqrt(norm);
        EXPECT_NEAR(contributed.tensor.data_as<float>()[at], want, 1e-6 * std::abs(want))
            << h << " " << i << " " << j;
        if (j > i) {
          EXPECT_EQ(contributed.tensor.data_as<float>()[at], 0.0f);  // causal: hidden
        }
      }
    }
  }
  const Outcome drawn = run_attn(
      "viz --weights n.npy --out m.svg --head 1 --title "
      "'||alpha_ij v_j||: what input j adds to query i'",
      dir);
  ASSERT_EQ(drawn.status, 0) << drawn.err;
  EXPECT_EQ(dir.read("n.svg"), dir.read("m.svg"));
}

TEST(Cli, LowerRankFilesKeepTheirRank) {
  const TempDir dir;
  const testing::Case c = sized(1, 3, 4, 6, 5, 2);
  const testing::Inputs in = testing::make_inputs(c);
  io::write_npy(dir.file("q.npy"), in.q, {3, 4, 5});
  io::write_npy(dir.file("k.npy"), in.k, {3, 6, 5});
  io::write_npy(dir.file("v.npy"), in.v, {3, 6, 2});
  const Outcome outcome = run_attn(
      "run --query q.npy --key k.npy --value v.npy --out c.npy --lse l.npy --weights w.npy", dir);
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  EXPECT_EQ(io::read_npy(dir.file("c.npy")).shape, (Shape{3, 4, 2}));
  EXPECT_EQ(io::read_npy(dir.file("l.npy")).shape, (Shape{3, 4}));
  EXPECT_EQ(io::read_npy(dir.file("w.npy")).shape, (Shape{3, 4, 6}));
  const Result want = forward(in.q, in.k, in.v);
  expect_close(io::read_npy(dir.file("c.npy")).tensor.view(), want.context.view(), "context");

  // bshd 3-D files are [S, H, D]; a 2-D file is [S, D] in either layout.
  const TempDir two;
  const testing::Case single = sized(1, 1, 4, 6, 5, 2);
  const testing::Inputs one_head = testing::make_inputs(single);
  io::write_npy(two.file("q.npy"), one_head.q, {4, 5});
  io::write_npy(two.file("k.npy"), one_head.k, {6, 5});
  io::write_npy(two.file("v.npy"), one_head.v, {6, 2});
  const Outcome flat =
      run_attn("run --layout bshd --query q.npy --key k.npy --value v.npy --out c.npy", two);
  ASSERT_EQ(flat.status, 0) << flat.err;
  const io::NpyArray context = io::read_npy(two.file("c.npy"));
  EXPECT_EQ(context.shape, (Shape{4, 2}));
  expect_close(context.tensor.view(), forward(one_head.q, one_head.k, one_head.v).context.view(),
               "2-D context");
}

// Inputs shared by the error tests: q, k, v of [1, 2, 3, 4] in a directory of their own.
class CliErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<float> values(24, 0.5f);
    const TensorView t(values.data(), DType::f32, {1, 2, 3, 4});
    for (const char* name : {"q.npy", "k.npy", "v.npy"})
      io::write_npy(inputs_.file(name), t, {1, 2, 3, 4});
  }

  std::string input(const std::string& name) const { return inputs_.file(name); }
  std::string good_inputs() const {
    return "--query " + input("q.npy") + " --key " + input("k.npy") + " --value " + input("v.npy");
  }

  // attn must exit 2 with one line "attn: error: ...<expected>..." and write nothing;
  // `shell` runs first (run_attn).
  void expect_error(const std::string& arguments, const std::string& expected,
                    const std::string& shell = "true") {
    SCOPED_TRACE(arguments);
    const TempDir workdir;
    const Outcome outcome = run_attn(arguments, workdir, shell);
    EXPECT_EQ(outcome.status, 2);
    EXPECT_EQ(outcome.err.rfind("attn: error: ", 0), 0u) << outcome.err;
    EXPECT_EQ(std::count(outcome.err.begin(), outcome.err.end(), '\n'), 1) << outcome.err;
    EXPECT_NE(outcome.err.find(expected), std::string::npos) << outcome.err;
    EXPECT_EQ(outcome.out, "");
    EXPECT_TRUE(workdir.entries().empty()) << "attn left files behind";
  }

  TempDir inputs_;
};

TEST_F(CliErrors, BadFiles) {
  const std::string good = inputs_.read("q.npy");
  inputs_.write("truncated.npy", good.substr(0, good.size() - 3));
  inputs_.write("magic.npy", "PK" + good.substr(2));
  std::string ints = good;
  ints.replace(ints.find("<f4"), 3, "<i4");
  inputs_.write("int.npy", ints);
  std::string huge = good;
  huge.replace(huge.find("(1, 2, 3, 4)"), 12, "(9999999999999, 99999999)");
  inputs_.write("huge.npy", huge);
  const std::vector<unsigned char> flags(24, 1);
  io::write_npy(input("bool.npy"), TensorView(flags.data(), DType::boolean, {1, 2, 3, 4}),
                {1, 2, 3, 4});

  const std::string kv = " --key " + input("k.npy") + " --value " + input("v.npy") + " --out c.npy";
  expect_error("run --query missing.npy" + kv,
               "missing.npy: cannot open: No such file or directory");
  expect_error("run --query " + input("truncated.npy") + kv, "truncated.npy: truncated data");
  expect_error("run --query " + input("magic.npy") + kv, "magic.npy: not a .npy file");
  expect_error("run --query " + input("int.npy") + kv, "unsupported dtype '<i4'");
  expect_error("run --query " + input("huge.npy") + kv, "huge.npy: absurd shape");
  expect_error("run --query " + input("bool.npy") + kv,
               "q: expected a floating-point dtype, given bool");
}

TEST_F(CliErrors, ShapeMismatches) {
  const std::vector<float> values(60, 0.5f);
  io::write_npy(input("k5.npy"), TensorView(values.data(), DType::f32, {1, 2, 3, 5}), {1, 2, 3, 5});
  io::write_npy(input("k3h.npy"), TensorView(values.data(), DType::f32, {1, 3, 3, 4}),
                {1, 3, 3, 4});
  io::write_npy(input("mask.npy"), TensorView(values.data(), DType::f32, {1, 1, 3, 5}), {3, 5});
  io::write_npy(input("slopes.npy"), TensorView(values.data(), DType::f32, {1, 1, 1, 3}), {3});
  const std::string vo = " --value " + input("v.npy") + " --out c.npy";
  expect_error("run --query " + input("q.npy") + " --key " + input("k5.npy") + vo,
               "k: expected shape [1, Hkv, Lk, 4]");
  expect_error("run --query " + input("q.npy") + " --key " + input("k3h.npy") + vo,
               "v: expected shape [1, 3, 3, Dv]");
  expect_error("run " + good_inputs() + " --out c.npy --mask " + input("mask.npy"),
               "mask: expected shape [1 or 1, 2 or 1, 3, 3], given [1, 1, 3, 5]");
  expect_error("run " + good_inputs() + " --out c.npy --alibi " + input("slopes.npy"),
               "alibi_slopes: expected 2 values");
  expect_error("run " + good_inputs() + " --out c.npy --sinks " + input("q.npy"),
               "expected a 1-D array");
}

TEST_F(CliErrors, BadOptions) {
  const std::string run = "run " + good_inputs() + " --out c.npy";
  expect_error("run " + good_inputs(), "--out is required");
  expect_error(run + " --scale abc", "--scale");
  expect_error(run + " --scale nan", "scale: expected a finite number");
  expect_error(run + " --window 3", "--window: expected L,R with integers >= -1, given '3'");
  expect_error(run + " --window 1,-2", "given '1,-2'");
  expect_error(run + " --softcap -1", "softcap: expected a finite number >= 0");
  expect_error(run + " --causal=sideways", "--causal: sideways not in {top-left,bottom-right}");
  expect_error(run + " --layout hbsd", "--layout");
  expect_error(run + " --threads -1", "--threads: expected an integer from 0 to 4096, given '-1'");
  expect_error(run + " --viz w.svg --viz-head -2",
               "--viz-head: expected an integer >= 0, given '-2'");
  expect_error(run + " --backend gpu", "--backend");
  ASSERT_EQ(::setenv("ATTN_BACKEND", "bogus", 1), 0);
  expect_error(run, "ATTN_BACKEND: expected 'reference' or unset (or empty), given 'bogus'");
  ::unsetenv("ATTN_BACKEND");
  expect_error(run + " --colour red", "--colour");
  expect_error(run + " --weights c.npy", "--weights: expected a path different from --out");
  expect_error("", "A subcommand is required");
  expect_error("frobnicate", "unknown command 'frobnicate': expected one of demo, run, viz");
  expect_error(run + " --viz-show contributions", "--viz-show: expected only with --viz");
  expect_error(run + " --viz w.svg --viz-show values", "--viz-show");
  expect_error(run + " --contributions c.npy",
               "--contributions: expected a path different from --out");
  expect_error("demo --tokens 0", "--tokens");
  expect_error("demo --translate --translate-steps 0", "--translate-steps");
  expect_error("demo --translate --translate-seconds -1", "--translate-seconds");
  expect_error("demo --translate --translate-pictures " + input("q.npy") + "/pictures",
               "--translate-pictures: cannot make the folder");
}

// Outputs appear all together or not at all: a second output that cannot be written
// (its directory is missing) must also keep the first from appearing.
TEST_F(CliErrors, FailedWritesLeaveNoOutputs) {
  expect_error("run " + good_inputs() + " --out c.npy --weights no/such/dir/w.npy",
               "no/such/dir/w.npy: cannot create");
  expect_error("run " + good_inputs() + " --out no/such/dir/c.npy", "cannot create");
}

// The case: the --lse target is a directory. The run must fail before replacing
// --out, which keeps its old contents.
TEST_F(CliErrors, AFailedOutputLeavesEveryOtherOutputAsItWas) {
  const TempDir dir;
  std::filesystem::create_directories(dir.path() / "out" / "l.npy");
  dir.write("out/c.npy", "OLD\n");
  const Outcome outcome =
      run_attn("run " + good_inputs() + " --out out/c.npy --lse out/l.npy", dir);
  EXPECT_EQ(outcome.status, 2);
  EXPECT_EQ(outcome.err,
            "attn: error: out/l.npy: expected a regular file or a new path, given a directory "
            "(attn replaces only regular files)\n");
  EXPECT_EQ(dir.read("out/c.npy"), "OLD\n");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"out"});
}

// Outputs that exist must be regular files: a FIFO or a symlink to a device is refused and
// stays as it was; a symlink to a regular file stays a link and its target gets the result.
TEST_F(CliErrors, SpecialFilesAreNeverReplaced) {
  const TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("fifo.npy").c_str(), 0600), 0);
  std::filesystem::create_symlink("/dev/null", dir.file("null.npy"));
  dir.write("real.npy", "OLD");
  std::filesystem::create_symlink("real.npy", dir.file("link.npy"));
  const std::string run = "run " + good_inputs() + " --out ";
  for (const auto& [out, kind] :
       {std::pair{"fifo.npy", "a FIFO"}, std::pair{"null.npy", "a character device"}}) {
    const Outcome refused = run_attn(run + out, dir);
    EXPECT_EQ(refused.status, 2) << out;
    EXPECT_EQ(refused.err, "attn: error: " + std::string(out) +
                               ": expected a regular file or a new path, given " + kind +
                               " (attn replaces only regular files)\n");
  }
  EXPECT_TRUE(std::filesystem::is_fifo(dir.file("fifo.npy")));
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("null.npy")));

  const Outcome linked = run_attn(run + "link.npy", dir);
  ASSERT_EQ(linked.status, 0) << linked.err;
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("link.npy")));
  EXPECT_EQ(io::read_npy(dir.file("real.npy")).shape, (Shape{1, 2, 3, 4}));
  EXPECT_EQ(dir.entries(),
            (std::vector<std::string>{"fifo.npy", "link.npy", "null.npy", "real.npy"}));
}

// SIGTERM or SIGINT while the outputs are written removes the staged files and exits with
// 128 + the signal. Not timing-dependent: the run is stopped (SIGSTOP) as soon as a staged
// file shows, and signalled only if one is still there, so the signal lands mid-write; a run
// that finished writing before the poll saw a staged file is retried with larger outputs.
TEST(Cli, SignalsWhileWritingRemoveStagedFiles) {
  for (const int signal_number : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(signal_number);
    bool signalled = false;
    for (Index len = 2048; len <= 8192 && !signalled; len *= 2) {
      const TempDir dir;
      const std::vector<float> values(static_cast<std::size_t>(len) * 8, 0.25f);
      const TensorView t(values.data(), DType::f32, {1, 1, len, 8});
      for (const char* name : {"q.npy", "k.npy", "v.npy"})
        io::write_npy(dir.file(name), t, {len, 8});
      const pid_t pid =
          start_attn({"run", "--query", "q.npy", "--key", "k.npy", "--value", "v.npy", "--out",
                      "c.npy", "--lse", "l.npy", "--weights", "w.npy", "--quiet"},
                     dir);
      ASSERT_GT(pid, 0);
      int status = 0;
      while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (!holds_staged_file(dir)) {
          ::usleep(100);
          continue;
        }
        ::kill(pid, SIGSTOP);
        ::waitpid(pid, &status, WUNTRACED);
        if (WIFSTOPPED(status)) {
          if (holds_staged_file(dir)) {
            ::kill(pid, signal_number);
            signalled = true;
          }
          ::kill(pid, SIGCONT);
          ::waitpid(pid, &status, 0);
        }
        break;
      }
      if (!signalled) continue;
      EXPECT_TRUE(WIFEXITED(status));
      EXPECT_EQ(WEXITSTATUS(status), 128 + signal_number);
      EXPECT_FALSE(holds_staged_file(dir));
    }
    EXPECT_TRUE(signalled) << "no run was caught while writing its outputs";
  }
}

// An ASan build: GCC defines __SANITIZE_ADDRESS__, clang answers __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define ATTN_ADDRESS_SANITIZER
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_ADDRESS_SANITIZER
#endif
#endif

// Weights that cannot fit in the memory left (here under `ulimit -v` of 2 GiB: 4 GiB of
// them) are refused with their size and what to do instead, before anything is allocated.
TEST(Cli, WeightsTooLargeForMemoryAreRefused) {
#if defined(ATTN_ADDRESS_SANITIZER)
  // An ASan-built attn reserves terabytes of shadow memory as it starts, which `ulimit -v`
  // refuses before main() runs; the Release build runs this test.
  GTEST_SKIP() << "ulimit -v stops an AddressSanitizer build from starting";
#endif
  const TempDir dir;
  const Index len = 32768;
  const std::vector<float> values(static_cast<std::size_t>(len), 0.5f);
  const TensorView t(values.data(), DType::f32, {1, 1, len, 1});
  for (const char* name : {"q.npy", "k.npy", "v.npy"}) io::write_npy(dir.file(name), t, {len, 1});
  const Outcome outcome =
      run_attn("run --query q.npy --key k.npy --value v.npy --out c.npy --weights w.npy", dir,
               "ulimit -v 2097152");
  EXPECT_EQ(outcome.status, 2);
  EXPECT_EQ(outcome.err.rfind("attn: error: --weights: the weights [1, 1, 32768, 32768] of float32 "
                              "needs 4.0 GiB, more than the ",
                              0),
            0u)
      << outcome.err;
  EXPECT_NE(outcome.err.find("leave out --weights and --viz, or compute chosen rows or the top_k"),
            std::string::npos)
      << outcome.err;
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"k.npy", "q.npy", "v.npy"}));
}

TEST_F(CliErrors, BadPictures) {
  const std::string run = "run " + good_inputs() + " --out c.npy";
  const std::string viz = "viz --weights " + input("q.npy");
  inputs_.write("two.txt", "a\nb\n");
  const std::vector<float> flat(5, 0.2f);
  io::write_npy(inputs_.file("flat.npy"), TensorView(flat.data(), DType::f32, {1, 1, 1, 5}), {5});
  expect_error(viz + " --out w.jpg",
               "--out: expected a file name ending in .svg, .png or .html, given 'w.jpg'");
  expect_error(viz, "--out is required");
  expect_error(viz + " --out w.svg --head 2", "--head: expected 0 .. 1, given 2");
  expect_error(viz + " --out w.svg --batch 1", "--batch: expected 0 .. 0, given 1");
  expect_error(viz + " --out w.svg --downsample median", "--downsample");
  expect_error(viz + " --out w.svg --tokens " + input("two.txt"),
               "--tokens: expected 3 (one per query) or 4 (one per key) tokens, given 2");
  expect_error(viz + " --out w.svg --tokens " + input("none.txt"), "--tokens: cannot read");
  expect_error("viz --weights " + input("flat.npy") + " --out w.svg",
               "--weights: expected 2 to 4 dims");
  expect_error(run + " --viz w.gif", "--viz: expected a file name ending in .svg, .png or .html");
  expect_error(run + " --viz w.svg --viz-head 2", "--viz-head: expected 0 .. 1, given 2");
  expect_error(run + " --viz c.npy", "--viz: expected a path different from --out");
  expect_error(run + " --viz w.svg --viz-tokens " + input("two.txt"),
               "--viz-tokens: expected 3 tokens, given 2");
  expect_error(run + " --viz no/such/dir/w.svg", "no/such/dir/w.svg: cannot create");
  expect_error("demo --heatmap d.txt", "--heatmap: expected a file name ending in .svg");
  // PNG text needs its font file; without it the PNG fails clearly, and SVGs still draw.
  const std::string no_font = "export ATTN_FONT=/no/such/font.ttf";
  expect_error(viz + " --out w.png",
               "font: no font file at '/no/such/font.ttf' (the PNG pictures draw their text in "
               "DejaVu Sans: install Debian's fonts-dejavu-core, or set ATTN_FONT to a .ttf file)",
               no_font);
  const TempDir dir;
  EXPECT_EQ(run_attn(viz + " --out w.svg", dir, no_font).status, 0);
}

TEST_F(CliErrors, BadBlends) {
  // q.npy read as weights: [1, 2, 3, 4], rows of 0.5 that sum to 2.
  const std::vector<float> values(8, 0.25f);
  io::write_npy(input("v4.npy"), TensorView(values.data(), DType::f32, {1, 1, 4, 2}), {4, 2});
  inputs_.write("two.txt", "a\nb\n");
  const std::string blend = "viz --blend --weights " + input("q.npy") + " --out b.svg";
  const std::string good = blend + " --value " + input("v4.npy");
  expect_error(blend, "--value: required with --blend");
  expect_error("viz --weights " + input("q.npy") + " --out b.svg --value " + input("v4.npy"),
               "--value requires --blend");
  expect_error(good + " --row 3", "--row: expected 0 .. 2 (weights [1, 2, 3, 4]), given 3");
  expect_error(good + " --head 2", "--head: expected 0 .. 1 (weights [1, 2, 3, 4]), given 2");
  expect_error(good + " --top 0", "--top");
  expect_error(blend + " --value " + input("v.npy"),
               "--value: expected [B, Hkv, Lk, Dv] = [1, a divisor of 2, 4, at least 1] to match "
               "--weights [1, 2, 3, 4], given [1, 2, 3, 4]");
  expect_error(good + " --tokens " + input("two.txt"),
               "--tokens: expected 4 tokens (one per input), given 2");
  expect_error(good, "--weights: expected weights that sum to 1");
  expect_error(
      "viz --blend --weights " + input("q.npy") + " --value " + input("v4.npy") + " --out b.gif",
      "--out: expected a file name ending in .svg, .png or .html");
  expect_error("demo --blend b.txt", "--blend: expected a file name ending in .svg");
  expect_error("demo --blend b.svg --blend-query 6", "--blend-query");
  expect_error("demo --generation g.svg",
               "--generation: expected a file name ending in .html, given 'g.svg'");
  expect_error("demo --alignment a.gif", "--alignment: expected a file name ending in .svg");
}

// The blend of `attn viz --blend` adds up to the context `attn run` computed.
TEST(Cli, BlendsInEveryFormatAddUpToTheContext) {
  const TempDir dir;
  const std::vector<float> q = {0.3f, -1.0f, 2.0f, 0.5f, 1.5f, 0.2f, -0.7f, 0.9f};
  const std::vector<float> k = {1.0f,  0.0f, -0.5f, 2.0f,  0.4f, 0.4f,
                                -1.2f, 0.3f, 0.8f,  -0.1f, 0.0f, 1.1f};
  const std::vector<float> v = {0.5f, -2.0f, 1.0f, 3.0f, 0.25f, -0.75f, 1.5f, 0.0f, -1.0f};
  io::write_npy(dir.file("q.npy"), TensorView(q.data(), DType::f32, {1, 1, 2, 4}), {2, 4});
  io::write_npy(dir.file("k.npy"), TensorView(k.data(), DType::f32, {1, 1, 3, 4}), {3, 4});
  io::write_npy(dir.file("v.npy"), TensorView(v.data(), DType::f32, {1, 1, 3, 3}), {3, 3});
  dir.write("tokens.txt", "one\n<two>\nthree\n");
  const Outcome computed = run_attn(
      "run --query q.npy --key k.npy --value v.npy --out c.npy --weights w.npy --quiet", dir);
  ASSERT_EQ(computed.status, 0) << computed.err;
  for (const char* name : {"b.svg", "b.png", "b.html"}) {
    const Outcome drawn =
        run_attn("viz --blend --weights w.npy --value v.npy --row 1 --tokens tokens.txt --out " +
                     std::string(name),
                 dir);
    ASSERT_EQ(drawn.status, 0) << drawn.err;
    EXPECT_EQ(drawn.out + drawn.err, "");
  }
  EXPECT_EQ(dir.read("b.png").rfind("\x89PNG\r\n", 0), 0u);
  EXPECT_EQ(dir.read("b.html").rfind("<!DOCTYPE html>", 0), 0u);
  const std::string svg = dir.read("b.svg");
  EXPECT_NE(svg.find("1 &lt;two&gt;"), std::string::npos);
  const io::NpyArray context = io::read_npy(dir.file("c.npy"));
  for (Index d = 0; d < 3; ++d) {
    const std::string cell =
        "class=\"context\" data-row=\"-1\" data-col=\"" + std::to_string(d) + "\" data-value=\"";
    const std::size_t at = svg.find(cell);
    ASSERT_NE(at, std::string::npos) << cell;
    const double drawn = std::stod(svg.substr(at + cell.size()));
    const double want = context.tensor.data_as<float>()[3 + d];  // row 1
    EXPECT_NEAR(drawn, want, 1e-6 * (1.0 + std::abs(want))) << "column " << d;
  }
}

TEST_F(CliErrors, PicturesInEveryFormat) {
  const TempDir dir;
  const Outcome computed = run_attn("run " + good_inputs() +
                                        " --out c.npy --weights w.npy "
                                        "--viz p.html --viz-head 1 --quiet",
                                    dir);
  ASSERT_EQ(computed.status, 0) << computed.err;
  EXPECT_EQ(computed.err, "");
  EXPECT_EQ(dir.read("p.html").rfind("<!DOCTYPE html>", 0), 0u);
  dir.write("tokens.txt", "k0\nk1\r\n<k3>\n");
  for (const char* name : {"h.svg", "h.png", "h.html"}) {
    const Outcome drawn = run_attn(
        "viz --weights w.npy --tokens tokens.txt --head 1 --out " + std::string(name), dir);
    ASSERT_EQ(drawn.status, 0) << drawn.err;
    EXPECT_EQ(drawn.out + drawn.err, "");
  }
  EXPECT_EQ(dir.read("h.svg").rfind("<?xml", 0), 0u);
  EXPECT_NE(dir.read("h.svg").find("&lt;k3&gt;"), std::string::npos);
  EXPECT_EQ(dir.read("h.png").rfind("\x89PNG\r\n", 0), 0u);
  EXPECT_EQ(dir.read("h.html").rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"c.npy", "h.html", "h.png", "h.svg", "p.html",
                                                     "tokens.txt", "w.npy"}));
}

TEST(Cli, DemoDrawsItsSentenceWhenAsked) {
  const TempDir dir;
  const Outcome demo = run_attn("demo --heads 1 --tokens 4 --dim 2 --heatmap d.svg", dir);
  ASSERT_EQ(demo.status, 0) << demo.err;
  EXPECT_LT(demo.out.find("drawn as a heatmap (query rows, key columns): d.svg"),
            demo.out.find("Part 2."));
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"d.svg"}));
  const std::string svg = dir.read("d.svg");
  for (const char* word : {">the<", ">cat<", ">sat<", ">on<", ">mat<"}) {
    EXPECT_NE(svg.find(word), std::string::npos) << word;
  }
}

TEST(Cli, DemoDrawsItsBlendsGenerationAndAlignmentWhenAsked) {
  const TempDir dir;
  const Outcome demo = run_attn(
      "demo --heads 1 --tokens 4 --dim 2 --blend b.html --generation g.html --alignment a.svg",
      dir);
  ASSERT_EQ(demo.status, 0) << demo.err;
  for (const char* text :
       {"drawn as blends of the embeddings: b.html",
        "with the cache's blocks and each step's blend: g.html", "Part 4. Alignment",
        "dort  <- sleeping", "(output words down, input words across): a.svg"}) {
    EXPECT_NE(demo.out.find(text), std::string::npos) << text;
  }
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"a.svg", "b.html", "g.html"}));
  const std::string page = dir.read("b.html");
  EXPECT_NE(page.find("max=\"5\""), std::string::npos) << "one step per word of the sentence";
  EXPECT_NE(dir.read("g.html").find("block "), std::string::npos);
  const std::string alignment = dir.read("a.svg");
  for (const char* word :
       {">le<", ">chat<", ">noir<", ">dort<", ">the<", ">black<", ">cat<", ">is<", ">sleeping<"}) {
    EXPECT_NE(alignment.find(word), std::string::npos) << word;
  }

  const Outcome one =
      run_attn("demo --heads 1 --tokens 4 --dim 2 --blend c.png --blend-query 2", dir);
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_EQ(dir.read("c.png").rfind("\x89PNG\r\n", 0), 0u);
}

TEST(Cli, HelpDocumentsEveryOption) {
  const TempDir dir;
  const Outcome top = run_attn("--help", dir);
  EXPECT_EQ(top.status, 0);
  EXPECT_NE(top.out.find("run"), std::string::npos);
  EXPECT_NE(top.out.find("demo"), std::string::npos);
  const Outcome run = run_attn("run --help", dir);
  EXPECT_EQ(run.status, 0);
  for (const char* option :
       {"--query",    "--key",        "--value",  "--out",           "--weights",
        "--lse",      "--mask",       "--causal", "--scale",         "--window",
        "--softcap",  "--alibi",      "--sinks",  "--layout",        "--threads",
        "--backend",  "=bhsd",        "=auto",    "1/sqrt(D)",       "--viz",
        "--viz-head", "--viz-tokens", "--quiet",  "--contributions", "--viz-show"}) {
    EXPECT_NE(run.out.find(option), std::string::npos) << option;
  }
  const Outcome demo = run_attn("demo --help", dir);
  EXPECT_EQ(demo.status, 0);
  for (const char* option : {"--heads",
                             "=8",
                             "--tokens",
                             "=1024",
                             "--dim",
                             "=64",
                             "--seed",
                             "--weights-out",
                             "--heatmap",
                             "--blend",
                             "--blend-query",
                             "--generation",
                             "--alignment",
                             "--translate",
                             "--translate-seconds",
                             "=55",
                             "--translate-steps",
                             "=3000",
                             "--translate-seed",
                             "--translate-pictures"}) {
    EXPECT_NE(demo.out.find(option), std::string::npos) << option;
  }
  const Outcome viz = run_attn("viz --help", dir);
  EXPECT_EQ(viz.status, 0);
  for (const char* option :
       {"--weights", "--out", "--tokens", "--head", "--batch", "--downsample", "=max",
        "--max-cells", "--title", "--blend", "--value", "--row", "--top"}) {
    EXPECT_NE(viz.out.find(option), std::string::npos) << option;
  }
  EXPECT_TRUE(dir.entries().empty());
}

// A few steps only: what the translator learns is tests/translator_test.cpp's.
TEST(Cli, DemoTranslatesAndDrawsItsCrossAttentionWhenAsked) {
  const TempDir dir;
  const Outcome plain = run_attn("demo --translate --translate-steps 3", dir);
  ASSERT_EQ(plain.status, 0) << plain.err;
  for (const char* text :
       {"6000 training sentences, 200 held out", "trained 3 steps in", "of words right", " <- "}) {
    EXPECT_NE(plain.out.find(text), std::string::npos) << text;
  }
  EXPECT_EQ(plain.out.find("Part 1."), std::string::npos);
  EXPECT_TRUE(dir.entries().empty());

  const Outcome drawn =
      run_attn("demo --translate --translate-steps 200 --translate-pictures out", dir);
  ASSERT_EQ(drawn.status, 0) << drawn.err;
  for (const char* name :
       {"alignment0.html", "alignment0.svg", "alignment0-steps.html", "alignment2-steps.html"}) {
    EXPECT_TRUE(std::filesystem::is_regular_file(dir.file("out/" + std::string(name)))) << name;
  }
}

TEST(Cli, DemoShowsTheStepsAndWritesOnlyWhenAsked) {
  const TempDir dir;
  const Outcome plain = run_attn("demo --heads 2 --tokens 33 --dim 8", dir);
  ASSERT_EQ(plain.status, 0) << plain.err;
  for (const char* text : {"Step 1. Scores", "Step 2. Weights", "row sum", "Step 3. Context",
                           "max |difference|", "[1, 2, 33, 8]", "checksum"}) {
    EXPECT_NE(plain.out.find(text), std::string::npos) << text;
  }
  EXPECT_TRUE(dir.entries().empty());

  const Outcome saved = run_attn("demo --heads 1 --tokens 4 --dim 2 --weights-out w.npy", dir);
  ASSERT_EQ(saved.status, 0) << saved.err;
  const io::NpyArray w = io::read_npy(dir.file("w.npy"));
  ASSERT_EQ(w.shape, (Shape{6, 6}));
  for (Index i = 0; i < 6; ++i) {
    double sum = 0.0;
    for (Index j = 0; j < 6; ++j) sum += w.tensor.data_as<double>()[i * 6 + j];
    EXPECT_NEAR(sum, 1.0, 1e-12) << "row " << i;
  }
}

}  // namespace
}  // namespace attn
