#include "support/skipped_tests.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace attn::testing {
namespace {

class SkippedTestPrinter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& test) override {
    const ::testing::TestResult& result = *test.result();
    if (!result.Skipped()) return;
    std::string reason;
    for (int i = 0; i < result.total_part_count(); ++i) {
      const ::testing::TestPartResult& part = result.GetTestPartResult(i);
      if (part.skipped()) reason += part.message();
    }
    std::printf("[  SKIPPED ] %s.%s: %s\n", test.test_suite_name(), test.name(), reason.c_str());
    std::fflush(stdout);
  }
};

}  // namespace

void print_skipped_tests() {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SkippedTestPrinter);
}

}  // namespace attn::testing
