#include "api/backend.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "attn/error.hpp"

namespace attn::api {
namespace {

void to_stderr(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
}

std::mutex notice_mutex;
FallbackNotice notice = to_stderr;
std::set<std::string> said;  // the reasons noticed so far

// Backend::automatic runs the reference because the fast kernel lacks `missing`: said once.
void notice_fallback(const std::string& missing) {
  const std::lock_guard<std::mutex> lock(notice_mutex);
  if (notice == nullptr || !said.insert(missing).second) return;
  notice(
      "attn: running the float64 reference, which is far slower: the fast CPU kernel does "
      "not serve " +
      missing +
      "; ask for backend reference to run it without this notice (explain says "
      "why before a call)");
}

}  // namespace

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

Explanation choose(Backend requested, const std::string& missing) {
  const Backend backend = resolve_backend(requested);
  if (backend == Backend::reference) {
    return {Backend::reference,
            requested == Backend::reference ? "the reference backend was asked for"
                                            : "ATTN_BACKEND=reference is set",
            ""};
  }
  if (missing.empty()) return {Backend::fast, "", ""};
  if (backend == Backend::fast) {
    return {Backend::fast,
            "the fast backend was asked for, and the fast CPU kernel does not serve " + missing +
                ": the call throws",
            ""};
  }
  return {Backend::reference, "the fast CPU kernel does not serve " + missing, ""};
}

bool use_fast_kernel(Backend requested, const std::string& missing) {
  if (choose(requested, missing).backend == Backend::reference) {
    if (!missing.empty() && resolve_backend(requested) == Backend::automatic) {
      notice_fallback(missing);
    }
    return false;
  }
  if (!missing.empty()) {
    throw Error("backend: expected a request the fast CPU kernel supports, given " + missing +
                "; use backend automatic or reference");
  }
  return true;
}

}  // namespace attn::api

namespace attn {

void set_fallback_notice(FallbackNotice line) {
  const std::lock_guard<std::mutex> lock(api::notice_mutex);
  api::notice = line;
}

}  // namespace attn
