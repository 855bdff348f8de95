// main() of the gtest binaries: GoogleTest's own, with each skipped test named and its
// reason printed (support/skipped_tests.hpp).
#include <gtest/gtest.h>

#include "support/skipped_tests.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  attn::testing::print_skipped_tests();
  return RUN_ALL_TESTS();
}
