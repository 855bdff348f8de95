#include "cpu/amx/tiles.hpp"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attn::cpu {

#if defined(__x86_64__) && defined(__linux__)
namespace {

constexpr unsigned kOsxsave = 1u << 27;                // CPUID.1:ECX
constexpr unsigned kAmxBf16 = 1u << 22;                // CPUID.(7,0):EDX
constexpr unsigned kAmxTile = 1u << 24;                // CPUID.(7,0):EDX
constexpr unsigned long long kXcr0Tiles = 3ull << 17;  // XTILECFG, XTILEDATA
constexpr long kArchRequestXcompPermission = 0x1023;   // ARCH_REQ_XCOMP_PERM
constexpr long kXfeatureTileData = 18;                 // XFEATURE_XTILEDATA

bool detect_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || (c & kOsxsave) == 0) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if ((d & kAmxTile) == 0 || (d & kAmxBf16) == 0) return false;
  unsigned low = 0, high = 0;
  asm("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  const unsigned long long xcr0 = (static_cast<unsigned long long>(high) << 32) | low;
  if ((xcr0 & kXcr0Tiles) != kXcr0Tiles) return false;
  // Linux (5.16 on) grants the 8 KiB of tile data per process on request; until then a tile
  // instruction raises SIGILL. Refused or unknown (older kernels): AVX512-BF16 it is.
  return syscall(SYS_arch_prctl, kArchRequestXcompPermission, kXfeatureTileData) == 0;
}

}  // namespace

bool has_amx() {
  static const bool usable = detect_amx();
  return usable;
}

#else

bool has_amx() {
  return false;
}

#endif

}  // namespace attn::cpu
