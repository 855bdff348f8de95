// The machine's fp32 FMA peak, measured in this process so that every benchmark can say
// which fraction of it a kernel reaches.
#pragma once

#include <optional>
#include <string>

namespace attn::bench {

struct FmaPeak {
  int threads = 1;
  double gflops = 0.0;  // best of several trials: the ceiling, not a typical value
  std::string target;   // the SIMD target Highway dispatched to, e.g. "AVX3"
};

// Runs independent chains of fp32 FMAs on `threads` OpenMP threads for the widest SIMD
// target this CPU supports; takes about 0.1 s.
FmaPeak measure_fma_peak(int threads);

// One trial of the FMA probe of measure_fma_peak (about 30 ms): GFLOP/s on `threads` threads.
// Run between a benchmark's repetitions, its trials see the load the repetitions see.
double fma_probe_gflops(int threads);

// The same for the bf16 dot product (vdpbf16ps, 4 FLOPs per fp32 lane) where the CPU has
// AVX512-BF16, else nothing. The unit low-precision kernels can use instead of widening.
std::optional<FmaPeak> measure_bf16_dot_peak(int threads);

// The same for AMX tiles (TDPBF16PS) where the CPU has AMX and Linux grants its tile data
// (cpu::has_amx), else nothing: the unit of forward's bf16 scores there.
std::optional<FmaPeak> measure_amx_peak(int threads);

}  // namespace attn::bench
