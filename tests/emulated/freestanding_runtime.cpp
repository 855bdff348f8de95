// The little of the C, C++, OpenMP and Highway runtimes that the kernels reach,
// for the emulator, which runs code without an operating system or libraries: memory from a
// fixed arena, OpenMP's loop on one thread, the CPU seen as having AVX512-BF16, and traps
// where an exception would be thrown (an emulated test stops there and fails).
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>

#include <cstddef>
#include <cstdint>
#include <new>

#define ATTN_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// Memory: one arena, never freed; each emulated call starts from its beginning.
alignas(64) unsigned char arena[32 << 20];
std::size_t arena_used = 0;

void* allocate(std::size_t bytes) {
  const std::size_t at = (arena_used + 63) / 64 * 64;
  if (at + bytes > sizeof arena) __builtin_trap();
  arena_used = at + bytes;
  return arena + at;
}

}  // namespace

ATTN_EXPORT void emulated_runtime_reset() {
  arena_used = 0;
}

ATTN_EXPORT __attribute__((optimize("no-tree-loop-distribute-patterns"))) void* memcpy(
    void* to, const void* from, std::size_t n) {
  auto* t = static_cast<unsigned char*>(to);
  const auto* f = static_cast<const unsigned char*>(from);
  for (std::size_t i = 0; i < n; ++i) t[i] = f[i];
  return to;
}

ATTN_EXPORT __attribute__((optimize("no-tree-loop-distribute-patterns"))) void* memmove(
    void* to, const void* from, std::size_t n) {
  auto* t = static_cast<unsigned char*>(to);
  const auto* f = static_cast<const unsigned char*>(from);
  if (t < f) {
    for (std::size_t i = 0; i < n; ++i) t[i] = f[i];
  } else {
    for (std::size_t i = n; i > 0; --i) t[i - 1] = f[i - 1];
  }
  return to;
}

ATTN_EXPORT __attribute__((optimize("no-tree-loop-distribute-patterns"))) void* memset(
    void* to, int value, std::size_t n) {
  auto* t = static_cast<unsigned char*>(to);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<unsigned char>(value);
  return to;
}

void* operator new(std::size_t bytes) {
  return allocate(bytes);
}
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  return allocate(bytes);
}
void operator delete(void*) noexcept {}
void operator delete(void*, std::size_t) noexcept {}

// Tensor's storage (the paged kernel's states).
ATTN_EXPORT void* aligned_alloc(std::size_t, std::size_t bytes) {
  return allocate(bytes);
}
ATTN_EXPORT void free(void*) {}

// Backward's scratch: huge pages where the OS gives them, here the arena.
namespace attn::cache {
void* allocate_huge_pages(std::size_t bytes) {
  return allocate(bytes);
}
void free_huge_pages(void*) {}
}  // namespace attn::cache

namespace hwy {
// Highway's own asserts a size: an allocation of 0 bytes aborts a native run.
void* AllocateAlignedBytes(std::size_t bytes, AllocPtr, void*) {
  if (bytes == 0) __builtin_trap();
  return allocate(bytes);
}
void FreeAlignedBytes(const void*, FreePtr, void*) {}
}  // namespace hwy

// Whether the emulated CPU multiplies AMX tiles: BochsCPU's model has no AMX, so the bf16
// scores take AVX512-BF16 (cpu/amx/detect.cpp asks CPUID and Linux, neither of which is here).
// The vdpbf16ps kernels are the ones under test here, whichever model BochsCPU says it is
// (cpu/cpu_model.cpp, not built here, would read Sapphire Rapids, where they do not pay).
namespace attn::cpu {
bool has_amx() {
  return false;
}
bool bf16_dot_at_fma_rate() {
  return true;
}
}  // namespace attn::cpu

// exp and log in double, exp in float (the state merges and the row's lse): Highway's,
// within 1 ulp, where the library's come from libm.
ATTN_EXPORT float nextafterf(float from, float to) {
  if (from != from || to != to) return from + to;
  if (from == to) return to;
  if (from == 0.0f) return to > 0.0f ? __FLT_DENORM_MIN__ : -__FLT_DENORM_MIN__;
  const auto bits = __builtin_bit_cast(std::uint32_t, from);
  return __builtin_bit_cast(float, (from < to) == (from > 0.0f) ? bits + 1 : bits - 1);
}

ATTN_EXPORT double exp(double x) {
  const hwy::HWY_NAMESPACE::CappedTag<double, 1> d;
  return hwy::HWY_NAMESPACE::GetLane(hwy::HWY_NAMESPACE::Exp(d, hwy::HWY_NAMESPACE::Set(d, x)));
}
ATTN_EXPORT float expf(float x) {
  const hwy::HWY_NAMESPACE::CappedTag<float, 1> d;
  return hwy::HWY_NAMESPACE::GetLane(hwy::HWY_NAMESPACE::Exp(d, hwy::HWY_NAMESPACE::Set(d, x)));
}
ATTN_EXPORT double log(double x) {
  const hwy::HWY_NAMESPACE::CappedTag<double, 1> d;
  return hwy::HWY_NAMESPACE::GetLane(hwy::HWY_NAMESPACE::Log(d, hwy::HWY_NAMESPACE::Set(d, x)));
}

ATTN_EXPORT void GOMP_parallel(void (*body)(void*), void* data, unsigned, unsigned) {
  body(data);
}
ATTN_EXPORT int omp_get_thread_num() {
  return 0;
}
// OpenMP's dynamic loop on the one thread there is: the whole range in one piece.
ATTN_EXPORT bool GOMP_loop_nonmonotonic_dynamic_start(long start, long end, long, long, long* first,
                                                      long* last) {
  *first = start;
  *last = end;
  return start < end;
}
ATTN_EXPORT bool GOMP_loop_nonmonotonic_dynamic_next(long*, long*) {
  return false;
}
ATTN_EXPORT void GOMP_loop_end() {}

// libgcc's view of the CPU for __builtin_cpu_supports: word 0 bit 4 is AVX512-BF16.
extern "C" {
__attribute__((visibility("default"))) unsigned int __cpu_features2[4] = {0x10, 0, 0, 0};
}
ATTN_EXPORT int __cxa_guard_acquire(std::uint64_t* guard) {
  return *reinterpret_cast<unsigned char*>(guard) == 0;
}
ATTN_EXPORT void __cxa_guard_release(std::uint64_t* guard) {
  *reinterpret_cast<unsigned char*>(guard) = 1;
}

// Exceptions: none is thrown on the paths the tests take; reaching one traps.
ATTN_EXPORT void* __cxa_begin_catch(void*) noexcept {
  __builtin_trap();
}
ATTN_EXPORT void __cxa_end_catch() {
  __builtin_trap();
}
ATTN_EXPORT void __cxa_rethrow() {
  __builtin_trap();
}
ATTN_EXPORT void _Unwind_Resume(void*) {
  __builtin_trap();
}
ATTN_EXPORT void __gxx_personality_v0() {
  __builtin_trap();
}
namespace std {
const nothrow_t nothrow{};
void __throw_length_error(const char*) {
  __builtin_trap();
}
void terminate() noexcept {
  __builtin_trap();
}
}  // namespace std
