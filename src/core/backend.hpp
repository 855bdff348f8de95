// Which backend serves a request: the caller's choice, unless the environment forces the
// reference (ATTN_BACKEND=reference).
#pragma once

#include "attn/options.hpp"

namespace attn::core {

Backend resolve_backend(Backend requested);

}  // namespace attn::core
