// How many threads a kernel uses.
#pragma once

namespace attn::cpu {

// requested > 0: that many. 0: ATTN_NUM_THREADS from the environment when set, else every
// core. Throws attn::Error when ATTN_NUM_THREADS is not a positive integer.
int resolve_threads(int requested);

}  // namespace attn::cpu
