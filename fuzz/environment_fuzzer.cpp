// The environment variables attn reads, ATTN_NUM_THREADS and ATTN_BACKEND, set to arbitrary
// text (the input up to its first newline, and the rest): a thread count in 1 .. 4096 or
// attn::Error, and the reference exactly when ATTN_BACKEND is "reference".
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "api/backend.hpp"
#include "attn/error.hpp"
#include "cpu/threads.hpp"

namespace {

constexpr std::size_t kMaxValue = 4096;

// putenv makes these buffers the environment entries themselves, so each input rewrites them
// in place; setenv would keep a copy of every value ever set.
char threads_entry[sizeof "ATTN_NUM_THREADS=" + kMaxValue] = "ATTN_NUM_THREADS=";
char backend_entry[sizeof "ATTN_BACKEND=" + kMaxValue] = "ATTN_BACKEND=";

// Sets the variable whose entry is `entry` (its name and '=' already there) to `value`, cut
// at its first NUL as the environment would.
void set_value(char* entry, std::size_t name_length, std::string_view value) {
  value = value.substr(0, std::min({value.find('\0'), value.size(), kMaxValue}));
  std::memcpy(entry + name_length, value.data(), value.size());
  entry[name_length + value.size()] = '\0';
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool installed = putenv(threads_entry) == 0 && putenv(backend_entry) == 0;
  if (!installed) std::abort();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t newline = std::min(input.find('\n'), input.size());
  set_value(threads_entry, std::strlen("ATTN_NUM_THREADS="), input.substr(0, newline));
  set_value(backend_entry, std::strlen("ATTN_BACKEND="), input.substr(std::min(newline + 1, size)));

  try {
    const int threads = attn::cpu::resolve_threads(0);
    if (threads < 1 || (threads > 4096 && threads != omp_get_num_procs())) std::abort();
  } catch (const attn::Error&) {
  }
  // ATTN_BACKEND: "reference" forces the reference, empty leaves the request, anything else
  // is refused with attn::Error.
  const char* backend = std::getenv("ATTN_BACKEND");
  const bool forced = std::strcmp(backend, "reference") == 0;
  try {
    const attn::Backend chosen = attn::api::resolve_backend(attn::Backend::fast);
    if ((chosen == attn::Backend::reference) != forced || (!forced && backend[0] != '\0')) {
      std::abort();
    }
  } catch (const attn::Error&) {
    if (forced || backend[0] == '\0') std::abort();
  }
  return 0;
}
