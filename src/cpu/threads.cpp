#include "threads.hpp"

#include <omp.h>

#include <cstdlib>
#include <string>

#include "attn/error.hpp"

namespace attn::cpu {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const char* text = std::getenv("ATTN_NUM_THREADS");
  if (text == nullptr || text[0] == '\0') return omp_get_num_procs();
  char* end = nullptr;
  const long count = std::strtol(text, &end, 10);
  if (*end != '\0' || count < 1 || count > 4096) {
    throw Error(std::string("ATTN_NUM_THREADS: expected a positive integer up to 4096, given \"") +
                text + "\"");
  }
  return static_cast<int>(count);
}

}  // namespace attn::cpu
