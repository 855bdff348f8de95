// attn::explain and the fallback notice: which backend a call runs and why, said before the
// call, and once when Backend::automatic runs the reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "cpu/bf16_dot.hpp"
#include "support/cases.hpp"
#include "support/error_message.hpp"
#include "support/targets.hpp"

namespace attn {
namespace {

testing::Inputs inputs_of(DType dtype) {
  testing::Case c;
  c.heads_q = 4, c.heads_kv = 2, c.len_q = 40, c.len_k = 50, c.dim = 32, c.dim_v = 32;
  c.dtype = dtype;
  return testing::make_inputs(c);
}

TEST(Explain, TheFastKernelNamesItsPlan) {
  const testing::Inputs in = inputs_of(DType::f32);
  const Explanation e = explain(in.q, in.k, in.v, in.options);
  EXPECT_EQ(e.backend, Backend::fast);
  EXPECT_EQ(e.reason, "");
  EXPECT_NE(e.plan.find("float32 FMA chains"), std::string::npos) << e.plan;
  EXPECT_NE(e.plan.find("dot products along d for fewer"), std::string::npos) << e.plan;
}

// Every target this CPU runs is the one explain names when it is the only one allowed; the
// list goes to the log, so a run under emulation shows which targets its tests reached.
TEST(Explain, NamesTheSimdTargetThatRuns) {
  const testing::Inputs in = inputs_of(DType::f32);
  std::string names;
  testing::for_each_target([&](std::int64_t target) {
    const std::string name = hwy::TargetName(target);
    const Explanation e = explain(in.q, in.k, in.v, in.options);
    EXPECT_EQ(e.plan.rfind("target " + name + " (", 0), 0u) << e.plan;
    names += " " + name;
  });
  std::printf("SIMD targets this CPU runs:%s\n", names.c_str());
}

// Where vdpbf16ps pays the plan names it; where it does not (Intel's, at half the FMA's
// rate), it names float32 FMAs for the products AMX does not take.
TEST(Explain, Bf16OnAvx512Bf16NamesItsDotProducts) {
  if (!cpu::has_bf16_dot()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  const testing::Inputs in = inputs_of(DType::bf16);
  for (const bool pays : {true, false}) {
    cpu::set_bf16_dot_pays_for_test(pays);
    const Explanation e = explain(in.q, in.k, in.v, in.options);
    EXPECT_EQ(e.plan.find("AVX512-BF16") != std::string::npos, pays) << e.plan;
  }
  cpu::set_bf16_dot_pays_for_test(std::nullopt);
}

TEST(Explain, Float64GoesToTheReferenceAndSaysWhy) {
  const testing::Inputs in = inputs_of(DType::f64);
  const Explanation e = explain(in.q, in.k, in.v, in.options);
  EXPECT_EQ(e.backend, Backend::reference);
  EXPECT_NE(e.reason.find("float64 inputs"), std::string::npos) << e.reason;
  EXPECT_EQ(e.plan, "");
}

TEST(Explain, AskedForBackendsSayTheyWereAskedFor) {
  testing::Inputs in = inputs_of(DType::f32);
  in.options.backend = Backend::reference;
  const Explanation reference = explain(in.q, in.k, in.v, in.options);
  EXPECT_EQ(reference.backend, Backend::reference);
  EXPECT_EQ(reference.reason, "the reference backend was asked for");
  testing::Inputs wide = inputs_of(DType::f64);
  wide.options.backend = Backend::fast;
  const Explanation fast = explain(wide.q, wide.k, wide.v, wide.options);
  EXPECT_NE(fast.reason.find("the call throws"), std::string::npos) << fast.reason;
}

TEST(Explain, ChecksItsArgumentsAsForwardDoes) {
  testing::Inputs in = inputs_of(DType::f32);
  in.options.softcap = -1.0;
  EXPECT_THROW(
      {
        try {
          explain(in.q, in.k, in.v, in.options);
        } catch (const Error& e) {
          EXPECT_EQ(std::string(e.what()).rfind("softcap:", 0), 0u) << e.what();
          throw;
        }
      },
      Error);
}

std::vector<std::string> noticed;

void remember(const std::string& line) {
  noticed.push_back(line);
}

// The default notice is stderr; one test process sees each reason once.
TEST(FallbackNotice, AutomaticSaysOncePerReasonWhenItRunsTheReference) {
  set_fallback_notice(remember);
  const testing::Inputs fast = inputs_of(DType::f32);
  forward(fast.q, fast.k, fast.v, fast.options);
  EXPECT_TRUE(noticed.empty()) << "the fast kernel ran, and said " << noticed[0];
  testing::Inputs asked = inputs_of(DType::f64);
  asked.options.backend = Backend::reference;
  forward(asked.q, asked.k, asked.v, asked.options);
  EXPECT_TRUE(noticed.empty()) << "the reference was asked for, and it said " << noticed[0];
  const testing::Inputs wide = inputs_of(DType::f64);
  forward(wide.q, wide.k, wide.v, wide.options);
  weights(wide.q, wide.k, wide.options);
  ASSERT_EQ(noticed.size(), 1u);
  EXPECT_NE(noticed[0].find("running the float64 reference"), std::string::npos) << noticed[0];
  EXPECT_NE(noticed[0].find("float64 inputs"), std::string::npos) << noticed[0];
  set_fallback_notice(nullptr);
}

}  // namespace
}  // namespace attn
