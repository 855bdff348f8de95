// Choices that differ between CPUs of one instruction set, made from the CPU's model by a table
// (cpu_model.cpp), never by timing at run time: they move bits, which must be the same on every
// run.
#pragma once

namespace attn::cpu {

struct CpuModel {
  bool intel = false;
  unsigned family = 0, model = 0;
};

// The family and model of CPUID leaf 1's EAX (the extended fields added where Intel's and
// AMD's manuals say).
CpuModel cpu_model_of(bool intel, unsigned signature);

// Whether `cpu` runs vdpbf16ps at least at the float32 FMA's FLOP rate: the table.
bool bf16_dot_at_fma_rate(const CpuModel& cpu);

// Does this CPU's vdpbf16ps (two bf16 products into each float32 lane) run at least at the
// float32 FMA's FLOP rate, so that bf16 products pay on it rather than on bf16 widened to
// float32? Asked where the CPU has AVX512-BF16 (has_bf16_dot, cpu/bf16_dot.hpp).
bool bf16_dot_at_fma_rate();

}  // namespace attn::cpu
