#include "api/backend.hpp"

#include <cstdlib>
#include <cstring>

#include "attn/error.hpp"

namespace attn::api {

Backend resolve_backend(Backend requested) {
  const char* forced = std::getenv("ATTN_BACKEND");
  if (forced != nullptr && std::strcmp(forced, "reference") == 0) return Backend::reference;
  return requested;
}

bool use_fast_kernel(Backend requested, const std::string& missing) {
  const Backend backend = resolve_backend(requested);
  if (backend == Backend::reference) return false;
  if (missing.empty()) return true;
  if (backend == Backend::fast) {
    throw Error("backend: expected a request the fast CPU kernel supports, given " + missing +
                "; use backend automatic or reference");
  }
  return false;
}

}  // namespace attn::api
