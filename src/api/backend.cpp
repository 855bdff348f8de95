#include "api/backend.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "attn/error.hpp"

namespace attn::api {

Backend resolve_backend(Backend requested) {
  const char* forced = std::getenv("ATTN_BACKEND");
  if (forced == nullptr || forced[0] == '\0') return requested;
  if (std::strcmp(forced, "reference") == 0) return Backend::reference;
  // A misspelt override must not quietly run the other backend.
  std::string shown;
  for (const char* c = forced; *c != '\0' && shown.size() < 64; ++c) {
    shown += (*c >= 0x20 && *c < 0x7f) ? std::string(1, *c) : "?";
  }
  throw Error("ATTN_BACKEND: expected 'reference' or unset (or empty), given '" + shown + "'");
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
