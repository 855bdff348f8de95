// How much memory a request may still take, so that work that cannot fit is refused with a
// message before anything large is allocated, not killed half-way by the OOM killer.
#pragma once

#include <cstdint>
#include <string>

#include "attn/tensor.hpp"

namespace attn::core {

// Bytes this process can still allocate: MemAvailable from /proc/meminfo, lowered to what
// the cgroup's limit leaves (v2 memory.max - memory.current, v1 limit - usage) and to what
// the address-space limit (ulimit -v) leaves; UINT64_MAX when none of them is known.
std::uint64_t available_memory();

// element * the product of dims, UINT64_MAX when that does not fit in 64 bits.
std::uint64_t bytes_of(const Dims& dims, std::uint64_t element);

// "12.5 GiB", "300.0 MiB": a byte count for messages.
std::string format_bytes(std::uint64_t bytes);

// Throws attn::OutOfMemory "<what> needs <bytes>, more than the <available> of memory
// available; <instead>" when bytes > available_memory().
void check_memory(const std::string& what, std::uint64_t bytes, const std::string& instead);

}  // namespace attn::core
