#include "core/backend.hpp"

#include <cstdlib>
#include <cstring>

namespace attn::core {

Backend resolve_backend(Backend requested) {
  const char* forced = std::getenv("ATTN_BACKEND");
  if (forced != nullptr && std::strcmp(forced, "reference") == 0) return Backend::reference;
  return requested;
}

}  // namespace attn::core
