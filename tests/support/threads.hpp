// A test's thread count: OpenMP's (loops in the test's own code) and attn's kernels'
// (ATTN_NUM_THREADS) for as long as it lives.
#pragma once

#include <omp.h>

#include <cstdlib>
#include <string>

namespace attn::testing {

class Threads {
 public:
  explicit Threads(int threads) : kept_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
    ::setenv("ATTN_NUM_THREADS", std::to_string(threads).c_str(), 1);
  }
  ~Threads() {
    omp_set_num_threads(kept_);
    ::unsetenv("ATTN_NUM_THREADS");
  }
  Threads(const Threads&) = delete;
  Threads& operator=(const Threads&) = delete;

 private:
  int kept_;
};

}  // namespace attn::testing
