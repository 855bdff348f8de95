// Peak resident memory that attn::forward or attn::backward adds beyond its inputs and
// outputs, read from the kernel's own accounting (/proc/self/status) around one call.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>

#include "attn/tensor.hpp"

namespace attn::bench {

struct MemoryReport {
  bool backward = false;  // attn::backward_into, else attn::forward_into
  Index length = 0;       // Lq = Lk
  Index dim = 0;
  int threads = 0;
  double seconds = 0.0;
  std::size_t input_bytes = 0;   // q, k, v (backward: also out, lse; dout is q)
  std::size_t output_bytes = 0;  // context (backward: dq, dk, dv)
  std::size_t rss_before = 0;    // VmRSS with inputs and output resident, before the call
  std::size_t peak_after = 0;    // VmHWM after the call
  bool peak_was_reset = false;   // VmHWM reset to VmRSS before the call (clear_refs)
  std::size_t extra_bytes() const { return peak_after > rss_before ? peak_after - rss_before : 0; }
};

// One causal call, B = 1, H = 1, fp32, Lq = Lk = length; threads = 0 means all cores.
MemoryReport measure_peak_memory(Index length, Index dim, int threads, bool backward);

void print(const MemoryReport& report);
nlohmann::json to_json(const MemoryReport& report);

}  // namespace attn::bench
