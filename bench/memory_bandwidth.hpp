// The machine's memory bandwidth, measured in this process (a STREAM-like probe), so that
// bandwidth-bound kernels such as decode can say which fraction of it they reach.
#pragma once

namespace attn::bench {

// GB/s (1e9 bytes per second), best of several trials, STREAM's byte counting (bytes the
// loop names: no write-allocate traffic).
struct MemoryBandwidth {
  int threads = 1;
  double read = 0.0;   // sum += a[i]: 4 bytes per element
  double copy = 0.0;   // a[i] = b[i]: 8 bytes per element
  double triad = 0.0;  // a[i] = b[i] + s c[i]: 12 bytes per element
  double best() const;
};

// Three float arrays of `bytes_per_array` bytes (far above the last-level cache), touched
// first by the threads that use them; about 1 s at 256 MiB.
MemoryBandwidth measure_memory_bandwidth(int threads, double bytes_per_array = 256.0 * (1 << 20));

}  // namespace attn::bench
