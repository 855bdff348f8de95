// Makes the BochsCPU emulator (PyPI's bochscpu-python) build a Sapphire Rapids CPU, with
// AVX512-BF16 and AVX512-FP16, whichever model it was built to emulate. It picks its model
// through the exported create_<model>_cpuid functions, called through the PLT, so this
// library, loaded into the global scope first (tests/python/emulator.py), answers for the
// models it may ask for with Bochs' own Sapphire Rapids.
#include <dlfcn.h>

struct BX_CPU_C;
struct bx_cpuid_t;

namespace {

using CpuidFactory = bx_cpuid_t* (*)(BX_CPU_C*);

// Bochs' Sapphire Rapids factory, found in the emulator's library that called us.
bx_cpuid_t* sapphire_rapids(BX_CPU_C* cpu, const void* caller) {
  Dl_info info;
  if (dladdr(caller, &info) == 0) return nullptr;
  void* emulator = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
  if (emulator == nullptr) return nullptr;
  const auto create =
      reinterpret_cast<CpuidFactory>(dlsym(emulator, "_Z28create_sapphire_rapids_cpuidP8BX_CPU_C"));
  return create == nullptr ? nullptr : create(cpu);
}

}  // namespace

#define ATTN_SAPPHIRE_RAPIDS_FOR(factory)                                                \
  extern "C" __attribute__((visibility("default"))) bx_cpuid_t* factory(BX_CPU_C* cpu) { \
    return sapphire_rapids(cpu, __builtin_return_address(0));                            \
  }

// The models with AVX-512 that BochsCPU builds (0.3.1: Tiger Lake; 0.4.0: Cannon Lake), and
// its generic one.
ATTN_SAPPHIRE_RAPIDS_FOR(_Z23create_bx_generic_cpuidP8BX_CPU_C)
ATTN_SAPPHIRE_RAPIDS_FOR(_Z29create_corei7_skylake_x_cpuidP8BX_CPU_C)
ATTN_SAPPHIRE_RAPIDS_FOR(_Z23create_corei3_cnl_cpuidP8BX_CPU_C)
ATTN_SAPPHIRE_RAPIDS_FOR(_Z29create_corei7_icelake_u_cpuidP8BX_CPU_C)
ATTN_SAPPHIRE_RAPIDS_FOR(_Z22create_tigerlake_cpuidP8BX_CPU_C)
