// Which backend a call runs, and why. The float64 reference is 100x slower than the fast
// kernel, so Backend::automatic never falls back to it silently: it says so once per reason
// on stderr (or to the notice set below), and attn::explain tells before any work, as
// PyTorch says "Flash attention kernel not used because ...".
#pragma once

#include <string>

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct Explanation {
  Backend backend = Backend::fast;  // what the call runs: Backend::fast or Backend::reference
  // Why the reference: what the fast kernel lacks ("float64 inputs ..."), or that it was
  // asked for (options.backend, or ATTN_BACKEND=reference); empty when fast.
  std::string reason;
  // The fast kernel's plan on this CPU: the kernel of each kind of row chunk and the context
  // path (docs/architecture.md, "The plan"); empty for the reference.
  std::string plan;
};

// What attn::forward(q, k, v, options) runs (attn::weights(q, k, options): pass k as v). The
// arguments are checked as forward checks them (attn::Error naming the argument);
// Backend::fast that cannot be served is not an error here, it is the reason.
Explanation explain(const TensorView& q, const TensorView& k, const TensorView& v,
                    const Options& options);

// Receives the one line Backend::automatic says when it runs the reference: once per reason
// per process, from the thread that called. The default writes it to stderr; nullptr says
// nothing. Not thread-safe against calls running: set it before them.
using FallbackNotice = void (*)(const std::string& line);
void set_fallback_notice(FallbackNotice notice);

}  // namespace attn
