// One timed repetition of the decode-style benches: a call repeated for at least 0.2 s.
#pragma once

#include <chrono>

namespace attn::bench {

// Calls `step` until 0.2 s have passed; returns the mean seconds per call.
template <class Step>
double time_repetition(Step&& step) {
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  do {
    step();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < 0.2);
  return elapsed / calls;
}

}  // namespace attn::bench
