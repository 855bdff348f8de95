#include "cpu/cpu_model.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace attn::cpu {

namespace {

// Intel's family 6 models whose vdpbf16ps issues on one port where FMAs issue on two: half the
// float32 FMA's FLOP rate. Emerald Rapids (207) measured (attn_bench's probes, 72.9 against
// 151.1 GFLOP/s a thread; bench/README.md); Sapphire Rapids (143) has the same core's ports.
// AMD's Zen 4 and Zen 5, measured, run it at twice the FMA's rate.
constexpr unsigned kHalfRateBf16DotModels[] = {143, 207};

}  // namespace

CpuModel cpu_model_of(bool intel, unsigned signature) {
  CpuModel cpu;
  cpu.intel = intel;
  const unsigned base_family = (signature >> 8) & 0xf;
  cpu.family = base_family == 0xf ? base_family + ((signature >> 20) & 0xff) : base_family;
  cpu.model = (signature >> 4) & 0xf;
  if (base_family == 0x6 || base_family == 0xf) cpu.model |= ((signature >> 16) & 0xf) << 4;
  return cpu;
}

bool bf16_dot_at_fma_rate(const CpuModel& cpu) {
  if (!cpu.intel || cpu.family != 6) return true;
  for (const unsigned model : kHalfRateBf16DotModels) {
    if (cpu.model == model) return false;
  }
  return true;
}

#if defined(__x86_64__)
namespace {

CpuModel this_cpu() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return {};
  const bool intel = b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;  // "GenuineIntel"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return {};
  return cpu_model_of(intel, a);
}

}  // namespace

bool bf16_dot_at_fma_rate() {
  static const bool at_fma_rate = bf16_dot_at_fma_rate(this_cpu());
  return at_fma_rate;
}

#else

bool bf16_dot_at_fma_rate() {
  return false;
}

#endif

}  // namespace attn::cpu
