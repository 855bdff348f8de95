// Which backend serves a request: the caller's choice, unless the environment forces the
// reference (ATTN_BACKEND=reference).
#pragma once

#include <string>

#include "attn/explain.hpp"
#include "attn/options.hpp"

namespace attn::api {

// Throws attn::Error when ATTN_BACKEND is set to anything but "reference" or "".
Backend resolve_backend(Backend requested);

// The backend a request runs and why (attn::explain), for a fast kernel lacking `missing`
// (empty: it serves the request); the plan is left to the caller.
Explanation choose(Backend requested, const std::string& missing);

// Whether the fast kernel serves a request that it lacks support for as `missing` says
// (empty: it supports it): not when the reference is asked for or forced, nor, with
// Backend::automatic, when something is missing, which it then says once per reason
// (attn::set_fallback_notice); with Backend::fast, a missing feature throws.
bool use_fast_kernel(Backend requested, const std::string& missing);

}  // namespace attn::api
