// The fast CPU backward kernel against the float64 reference backward, on every case of
// the forward case list and on every SIMD target compiled in that this CPU runs; thread
// count determinism; every argument error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "core/rows.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/error_message.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

using testing::Case;
using testing::for_each_target;
using testing::GuardedTensor;
using ::testing::HasSubstr;
using ::testing::StartsWith;

Dims out_shape(const TensorView& q, const TensorView& v) {
  return {q.shape[0], q.shape[1], q.shape[2], v.shape[3]};
}
Dims lse_shape(const TensorView& q) {
  return {q.shape[0], q.shape[1], q.shape[2], 1};
}

// A case's inputs (edited, when `edit` is given, before the forward runs), the forward's
// out and lse (float32, from the reference), and a random dout in the inputs' dtype.
struct Request {
  explicit Request(const Case& c, const std::function<void(testing::Inputs&)>& edit = {},
                   unsigned seed = 1)
      : in(testing::make_inputs(c, seed)) {
    if (edit) edit(in);
    Options options = in.options;
    options.backend = Backend::reference;
    out = Tensor(DType::f32, out_shape(in.q, in.v));
    lse = Tensor(DType::f32, lse_shape(in.q));
    forward_into(in.q, in.k, in.v, options, {out.mutable_view(), lse.mutable_view(), {}});
    dout = Tensor(c.dtype, out_shape(in.q, in.v));
    std::mt19937_64 rng(seed + 100);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> row(static_cast<std::size_t>(c.dim_v));
    const Dims& s = dout.shape();
    for (Index b = 0; b < s[0]; ++b)
      for (Index h = 0; h < s[1]; ++h)
        for (Index i = 0; i < s[2]; ++i) {
          for (double& x : row) x = normal(rng);
          core::store_row(dout.mutable_view(), b, h, i, row.data());
        }
  }
  BackwardInputs inputs() const { return {in.q, in.k, in.v, out.view(), lse.view(), dout.view()}; }

  testing::Inputs in;
  Tensor out, lse, dout;
};

struct ReferenceGradients {
  Tensor dq, dk, dv, dsinks, dbias;
};

// [1, heads of the table, 1, columns]: the shape of a position bias table's gradient.
Dims bias_gradient_shape(const Options& options) {
  const PositionBias& bias = *options.position_bias;
  return {1, static_cast<Index>(bias.table.size()) / bias.columns, 1, bias.columns};
}

ReferenceGradients run_reference(const Request& r) {
  ReferenceGradients want{Tensor(DType::f64, r.in.q.shape), Tensor(DType::f64, r.in.k.shape),
                          Tensor(DType::f64, r.in.v.shape), Tensor(), Tensor()};
  Options options = r.in.options;
  options.backend = Backend::reference;
  Gradients g{want.dq.mutable_view(), want.dk.mutable_view(), want.dv.mutable_view(), {}, {}};
  if (!options.sinks.empty()) {
    want.dsinks = Tensor(DType::f64, {1, r.in.q.shape[1], 1, 1});
    g.dsinks = want.dsinks.mutable_view();
  }
  if (options.position_bias) {
    want.dbias = Tensor(DType::f64, bias_gradient_shape(options));
    g.dposition_bias = want.dbias.mutable_view();
  }
  backward_into(r.inputs(), options, g);
  return want;
}

// Bounds against float64: fp32 accumulation over rows and keys, P from a float32 lse and D
// from a float32 out, on the same stored inputs (so f16/bf16 are as tight as f32). Worst
// NMSE seen: 2.3e-12 over the quick list; 5.1e-11 over the full sweep, at D 1 with 3 keys,
// where dS = P (dP - D) cancels for a value near the output's.
constexpr double kGradientNmse = 1e-10;
// ALiBi over long rows: scores of magnitude slope x distance; worst NMSE seen 1.1e-11.
constexpr double kAlibiGradientNmse = 1e-10;
// dsinks sums P_sink D over every row in float64 from float32 D; worst seen 1.2e-6.
constexpr double kSinkMaxAbs = 1e-5;
// The position bias table's gradient sums float32 dS by offset, then by column in float64.
constexpr double kBiasGradientNmse = 1e-9;

double nmse_bound(const Case& c) {
  return c.alibi ? kAlibiGradientNmse : kGradientNmse;
}

void expect_close(const char* name, const GuardedTensor& got, const Tensor& want, double bound) {
  SCOPED_TRACE(name);
  EXPECT_TRUE(got.guards_intact()) << "written out of bounds";
  const testing::Comparison c = testing::compare(got.const_view(), want.view());
  EXPECT_TRUE(c.hard_failure.empty()) << testing::describe(c);
  EXPECT_LT(c.nmse, bound) << testing::describe(c);
}

// The fast kernel's f32 gradients against the reference's.
void expect_fast_matches(const Request& r, const ReferenceGradients& want, double bound,
                         int threads = 0) {
  GuardedTensor dq(DType::f32, r.in.q.shape), dk(DType::f32, r.in.k.shape),
      dv(DType::f32, r.in.v.shape), dsinks(DType::f32, {1, r.in.q.shape[1], 1, 1});
  Options options = r.in.options;
  options.backend = Backend::fast;
  options.threads = threads;
  std::optional<GuardedTensor> dbias;
  Gradients g{dq.view(), dk.view(), dv.view(), {}, {}};
  if (!options.sinks.empty()) g.dsinks = dsinks.view();
  if (options.position_bias) {
    dbias.emplace(DType::f32, bias_gradient_shape(options));
    g.dposition_bias = dbias->view();
  }
  backward_into(r.inputs(), options, g);
  if (dbias) expect_close("dposition_bias", *dbias, want.dbias, kBiasGradientNmse);
  expect_close("dq", dq, want.dq, bound);
  expect_close("dk", dk, want.dk, bound);
  expect_close("dv", dv, want.dv, bound);
  if (!options.sinks.empty()) {
    const testing::Comparison c = testing::compare(dsinks.const_view(), want.dsinks.view());
    EXPECT_TRUE(dsinks.guards_intact());
    EXPECT_TRUE(c.hard_failure.empty()) << "dsinks: " << testing::describe(c);
    EXPECT_LT(c.max_abs, kSinkMaxAbs) << "dsinks: " << testing::describe(c);
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.name();
}

class FastBackward : public ::testing::TestWithParam<Case> {};

TEST_P(FastBackward, MatchesReferenceOnEveryTarget) {
  const Request r(GetParam());
  const ReferenceGradients want = run_reference(r);
  for_each_target([&] { expect_fast_matches(r, want, nmse_bound(GetParam())); });
}

// The cases the fast kernel serves (float64 goes to the reference).
std::vector<Case> supported(const std::vector<Case>& cases) {
  std::vector<Case> out;
  for (const Case& c : cases) {
    if (c.dtype != DType::f64) out.push_back(c);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, FastBackward, ::testing::ValuesIn(supported(testing::case_list())),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Dropout, FastBackward,
                         ::testing::ValuesIn(supported(testing::dropout_cases())), case_name);

// Past several key blocks, query tiles and key parts, at head dims with their own copy.
TEST(FastBackwardLarger, MatchesReferenceOnEveryTarget) {
  auto shaped = [](Index hq, Index hkv, Index lq, Index lk, Index d) {
    Case c;
    c.heads_q = hq, c.heads_kv = hkv, c.len_q = lq, c.len_k = lk, c.dim = d, c.dim_v = d;
    return c;
  };
  Case causal = shaped(4, 2, 300, 300, 64);
  causal.causal = true;
  Case window = shaped(2, 1, 200, 260, 128);
  window.window = {70, 10}, window.softcap = 10.0, window.sinks = true, window.dtype = DType::bf16;
  for (const Case& c : {causal, window}) {
    SCOPED_TRACE(c.name());
    const Request r(c);
    const ReferenceGradients want = run_reference(r);
    for_each_target([&] { expect_fast_matches(r, want, nmse_bound(c)); });
  }
}

// Hidden keys are skipped, not multiplied by zero: NaN in a hidden k or v row must not reach
// the gradients of rows that do not see it.
TEST(FastBackwardHiddenKeys, NanInHiddenKeysNeverReachesGradients) {
  Case c;
  c.heads_q = 4, c.heads_kv = 2, c.len_q = 70, c.len_k = 150, c.dim = 64, c.dim_v = 64;
  Case causal = c;
  causal.causal = true;
  Case boolean = c;
  boolean.mask = testing::MaskCase::boolean;
  for (const Case& variant : {causal, boolean}) {
    SCOPED_TRACE(variant.name());
    const Request r(variant, [&](testing::Inputs& in) {
      testing::poison_key(in, 100);
      if (variant.mask == testing::MaskCase::none) return;
      // Hidden from every row, so every gradient but the key's own stays finite.
      bool* mask = in.mask_storage.data_as<bool>();
      for (Index i = 0; i < c.len_q; ++i) mask[i * c.len_k + 100] = false;
    });
    const ReferenceGradients want = run_reference(r);
    for_each_target([&] { expect_fast_matches(r, want, kGradientNmse); });
  }
}

Case determinism_case() {
  Case c;
  c.heads_q = 6, c.heads_kv = 2, c.len_q = 133, c.len_k = 210, c.dim = 64, c.dim_v = 64;
  c.causal = true, c.align = CausalAlign::bottom_right, c.alibi = true, c.sinks = true;
  c.softcap = 20.0;
  return c;
}

TEST(FastBackwardThreads, BitwiseIdenticalForAnyThreadCount) {
  const Request r(determinism_case());
  std::vector<std::vector<unsigned char>> results;
  for (const int threads : {1, 2, 3}) {
    Options options = r.in.options;
    options.backend = Backend::fast;
    options.threads = threads;
    const BackwardResult g = backward(r.inputs(), options);
    std::vector<unsigned char> bytes;
    for (const Tensor* t : {&g.dq, &g.dk, &g.dv, &g.dsinks}) {
      const auto* data = static_cast<const unsigned char*>(t->data());
      bytes.insert(bytes.end(), data, data + t->nbytes());
    }
    results.push_back(std::move(bytes));
  }
  for (std::size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i], results[0]) << i;
}

// Gradients in every float dtype the views may have; backward() gives the inputs' dtypes.
TEST(FastBackwardOutputs, WritesEveryGradientDtype) {
  Case c;
  c.heads_q = 2, c.len_q = 50, c.len_k = 90, c.dim = 40, c.dim_v = 40, c.causal = true;
  const Request r(c);
  const ReferenceGradients want = run_reference(r);
  const std::pair<DType, double> dtypes[] = {
      {DType::f16, 1e-6}, {DType::bf16, 1e-4}, {DType::f64, kGradientNmse}};
  for (const auto& [dtype, bound] : dtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    GuardedTensor dq(dtype, r.in.q.shape), dk(dtype, r.in.k.shape), dv(dtype, r.in.v.shape);
    Options options = r.in.options;
    options.backend = Backend::fast;
    backward_into(r.inputs(), options, {dq.view(), dk.view(), dv.view(), {}, {}});
    expect_close("dq", dq, want.dq, bound);
    expect_close("dk", dk, want.dk, bound);
    expect_close("dv", dv, want.dv, bound);
  }
  Case half = c;
  half.dtype = DType::bf16;
  const BackwardResult g = backward(Request(half).inputs(), {});
  EXPECT_EQ(g.dq.dtype(), DType::bf16);
  EXPECT_EQ(g.dk.dtype(), DType::bf16);
  EXPECT_EQ(g.dv.dtype(), DType::bf16);
  EXPECT_EQ(g.dsinks.numel(), 0);
}

TEST(FastBackwardDispatch, Float64GoesToTheReference) {
  Case c;
  c.heads_q = 2, c.len_q = 5, c.len_k = 6, c.dim = 8, c.dim_v = 8, c.dtype = DType::f64;
  c.sinks = true;
  const Request r(c);
  const BackwardResult automatic = backward(r.inputs(), r.in.options);
  const ReferenceGradients want = run_reference(r);
  EXPECT_EQ(automatic.dsinks.dtype(), DType::f64);
  EXPECT_EQ(std::memcmp(automatic.dq.data(), want.dq.data(), want.dq.nbytes()), 0);
  EXPECT_EQ(std::memcmp(automatic.dsinks.data(), want.dsinks.data(), want.dsinks.nbytes()), 0);
  Options fast = r.in.options;
  fast.backend = Backend::fast;
  const std::string message = testing::error_message([&] { backward(r.inputs(), fast); });
  EXPECT_THAT(message, StartsWith("backend: "));
  EXPECT_THAT(message, HasSubstr("float64"));
}

// ---- Argument errors ----------------------------------------------------------------------

// A valid request (q [1, 4, 3, 8], k [1, 2, 5, 8], v [1, 2, 5, 6], sinks) that each case
// breaks in one way.
struct Valid {
  Valid() {
    Case c;
    c.heads_q = 4, c.heads_kv = 2, c.len_q = 3, c.len_k = 5, c.dim = 8, c.dim_v = 6;
    c.sinks = true;
    request.emplace(c);
    inputs = request->inputs();
    options = request->in.options;
    dq = Tensor(DType::f32, inputs.q.shape);
    dk = Tensor(DType::f32, inputs.k.shape);
    dv = Tensor(DType::f32, inputs.v.shape);
    dsinks = Tensor(DType::f32, {1, 4, 1, 1});
    gradients = {
        dq.mutable_view(), dk.mutable_view(), dv.mutable_view(), dsinks.mutable_view(), {}};
  }
  std::string error() const {
    return testing::error_message([&] { backward_into(inputs, options, gradients); });
  }

  std::optional<Request> request;
  BackwardInputs inputs;
  Options options;
  Tensor dq, dk, dv, dsinks;
  Gradients gradients;
};

TEST(BackwardErrors, ValidRequestPasses) {
  EXPECT_EQ(Valid().error(), "no error");
}

TEST(BackwardErrors, EveryMismatchNamesItsArgument) {
  struct Breakage {
    std::string argument;
    std::function<void(Valid&)> edit;
  };
  const Breakage cases[] = {
      {"q: ", [](Valid& v) { v.inputs.q.dtype = DType::boolean; }},
      {"k: ", [](Valid& v) { v.inputs.k.shape[3] = 7; }},
      {"out: ", [](Valid& v) { v.inputs.out.shape[3] = 5; }},
      {"out: ", [](Valid& v) { v.inputs.out.dtype = DType::boolean; }},
      {"out: ", [](Valid& v) { v.inputs.out.strides[3] = 2; }},
      {"lse: ", [](Valid& v) { v.inputs.lse.shape[2] = 4; }},
      {"lse: ", [](Valid& v) { v.inputs.lse.dtype = DType::f16; }},
      {"dout: ", [](Valid& v) { v.inputs.dout.shape[1] = 2; }},
      {"dout: ", [](Valid& v) { v.inputs.dout.data = nullptr; }},
      {"dq: ", [](Valid& v) { v.gradients.dq.shape[2] = 2; }},
      {"dq: ", [](Valid& v) { v.gradients.dq.strides[3] = 3; }},
      {"dk: ", [](Valid& v) { v.gradients.dk.shape[1] = 4; }},
      {"dv: ", [](Valid& v) { v.gradients.dv.shape[3] = 8; }},
      {"dv: ", [](Valid& v) { v.gradients.dv.dtype = DType::boolean; }},
      {"dsinks: ", [](Valid& v) { v.gradients.dsinks.reset(); }},
      {"dsinks: ", [](Valid& v) { v.gradients.dsinks->shape[1] = 2; }},
      {"dsinks: ", [](Valid& v) { v.gradients.dsinks->dtype = DType::bf16; }},
      {"dsinks: ", [](Valid& v) { v.options.sinks.clear(); }},
      {"sinks: ", [](Valid& v) { v.options.sinks.pop_back(); }},
      {"softcap: ", [](Valid& v) { v.options.softcap = -1.0; }},
      {"window.left: ", [](Valid& v) { v.options.window.left = -2; }},
  };
  for (const Breakage& b : cases) {
    Valid v;
    b.edit(v);
    EXPECT_THAT(v.error(), StartsWith(b.argument));
    EXPECT_THAT(v.error(), HasSubstr("expected"));
  }
}

TEST(BackwardErrors, BackwardChecksBeforeAllocating) {
  Valid v;
  v.inputs.lse.shape[3] = 2;
  const std::string message = testing::error_message([&] { backward(v.inputs, v.options); });
  EXPECT_THAT(message, StartsWith("lse: "));
}

}  // namespace
}  // namespace attn
