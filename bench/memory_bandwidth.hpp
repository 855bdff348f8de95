// The machine's memory bandwidth, measured in this process (a STREAM-like probe), so that
// bandwidth-bound kernels such as decode can say which fraction of it they reach.
#pragma once

#include <cstdint>
#include <memory>

namespace attn::bench {

// GB/s (1e9 bytes per second), each the best of the trials so far, STREAM's byte counting
// (bytes the loop names: no write-allocate traffic).
struct MemoryBandwidth {
  double read = 0.0;   // sum += a[i]: 4 bytes per element
  double copy = 0.0;   // a[i] = b[i]: 8 bytes per element
  double triad = 0.0;  // a[i] = b[i] + s c[i]: 12 bytes per element
  // STREAM's figure of merit, the better of copy and triad: what decode is held against.
  double stream() const;
};

// Three float arrays of `bytes_per_array` bytes (far above the last-level cache), in the
// same kind of memory as KVCache's pools (2 MiB-aligned, transparent huge pages asked for),
// touched first by `max_threads` threads in the static split the trials use. The loops are
// SIMD in the widest target Highway dispatches to, so that no figure is bound by
// instructions.
class MemoryBandwidthProbe {
 public:
  explicit MemoryBandwidthProbe(int max_threads, double bytes_per_array = 256.0 * (1 << 20));

  // One trial each of read, copy and triad on `threads` threads (at most max_threads),
  // raising `best` where one is faster; about 0.1 s on one thread. A caller that alternates
  // trials with the work it compares against the probe sees both under the same load.
  void trial(int threads, MemoryBandwidth& best);

 private:
  struct FreeHugePages {
    void operator()(float* p) const;
  };
  using Array = std::unique_ptr<float[], FreeHugePages>;
  static Array allocate(std::int64_t elements);

  std::int64_t elements_ = 0;
  Array a_, b_, c_;
};

}  // namespace attn::bench
