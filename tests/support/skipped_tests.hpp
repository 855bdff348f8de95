// Each skipped test said by name, with its reason, even under --gtest_brief: ctest runs the
// gtest binaries in shards that pass as a whole, so these lines are what tells the log that
// a test did not run (make prints them after ctest).
#pragma once

namespace attn::testing {

// Prints "[  SKIPPED ] Suite.Test: reason" on stdout as each skipped test ends.
void print_skipped_tests();

}  // namespace attn::testing
