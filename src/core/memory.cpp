#include "core/memory.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "attn/error.hpp"

namespace attn::core {
namespace {

constexpr std::uint64_t kUnknown = std::numeric_limits<std::uint64_t>::max();

// The value after `key` in a "Key: value kB" file such as /proc/meminfo, in bytes.
std::uint64_t kilobytes_field(const char* path, const std::string& key) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    std::uint64_t kilobytes = 0;
    if (fields >> kilobytes) return kilobytes * 1024;
  }
  return kUnknown;
}

// A file holding one number ("max" or missing: unknown).
std::uint64_t number_in(const char* path) {
  std::ifstream file(path);
  std::uint64_t value = 0;
  if (!(file >> value)) return kUnknown;
  return value;
}

std::uint64_t left_under(std::uint64_t limit, std::uint64_t used) {
  if (limit == kUnknown || used == kUnknown) return kUnknown;
  return limit > used ? limit - used : 0;
}

}  // namespace

std::uint64_t available_memory() {
  std::uint64_t available = kilobytes_field("/proc/meminfo", "MemAvailable:");
  available = std::min(available, left_under(number_in("/sys/fs/cgroup/memory.max"),
                                             number_in("/sys/fs/cgroup/memory.current")));
  available =
      std::min(available, left_under(number_in("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
                                     number_in("/sys/fs/cgroup/memory/memory.usage_in_bytes")));
  rlimit address_space{};
  if (getrlimit(RLIMIT_AS, &address_space) == 0 && address_space.rlim_cur != RLIM_INFINITY) {
    available = std::min(available, left_under(address_space.rlim_cur,
                                               kilobytes_field("/proc/self/status", "VmSize:")));
  }
  return available;
}

std::uint64_t bytes_of(const Dims& dims, std::uint64_t element) {
  std::uint64_t bytes = element;
  for (const Index extent : dims) {
    if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(extent), &bytes)) {
      return kUnknown;
    }
  }
  return bytes;
}

std::string format_bytes(std::uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(units)) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

void check_memory(const std::string& what, std::uint64_t bytes, const std::string& instead) {
  const std::uint64_t available = available_memory();
  if (bytes <= available) return;
  throw OutOfMemory(what + " needs " + format_bytes(bytes) + ", more than the " +
                    format_bytes(available) + " of memory available; " + instead);
}

}  // namespace attn::core
