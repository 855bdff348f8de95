// The compile-time head-dim switch of the forward kernel: the dims of common models get
// their own copy of the kernel, with loop bounds known to the compiler; every other dim
// runs the generic one (0).
#pragma once

#include <type_traits>

#include "attn/tensor.hpp"

namespace attn::cpu {

// Measured: the generic copy runs d=64 and d=128 within 2% of their own copies (the
// micro-kernels are FMA-bound either way), so the copies are insurance for other compilers.
// Sanitizer builds (ATTN_GENERIC_HEAD_DIM_ONLY) compile the generic copy alone: the copies
// differ only in constant loop bounds, and six copies per target cost minutes under ASan.
template <class Fn>
void with_head_dim([[maybe_unused]] Index dim_qk, [[maybe_unused]] Index dim_v, Fn&& fn) {
#ifndef ATTN_GENERIC_HEAD_DIM_ONLY
  if (dim_qk == dim_v) {
    switch (dim_qk) {
      case 64:
        fn(std::integral_constant<int, 64>{});
        return;
      case 80:
        fn(std::integral_constant<int, 80>{});
        return;
      case 96:
        fn(std::integral_constant<int, 96>{});
        return;
      case 128:
        fn(std::integral_constant<int, 128>{});
        return;
      case 256:
        fn(std::integral_constant<int, 256>{});
        return;
      default:
        break;
    }
  }
#endif
  fn(std::integral_constant<int, 0>{});
}

}  // namespace attn::cpu
