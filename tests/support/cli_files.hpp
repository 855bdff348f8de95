// What the tests of the attn command share about the files it writes: how to see one as
// [b, h, s, d], and how close its values must be to the library's.
#pragma once

#include <gtest/gtest.h>

#include "attn/attn.hpp"
#include "io/npy.hpp"
#include "support/compare.hpp"

namespace attn::testing {

// A file read back as a [b, h, s, d] view: bshd files are [B, S, H, D].
inline TensorView view_of(const io::NpyArray& array, bool bshd) {
  const Dims stored = array.tensor.shape();
  if (!bshd) return array.tensor.view();
  const Dims bhsd{stored[0], stored[2], stored[1], stored[3]};
  return TensorView(array.tensor.data(), array.tensor.dtype(), bhsd, bshd_strides(bhsd));
}

// Equal to float32 rounding: the command computes as the library does, possibly in another
// order (the ranks of --distributed merge states along the ring), so not bitwise.
inline void expect_close(const TensorView& got, const TensorView& want, const char* what) {
  const Comparison c = compare(got, want);
  EXPECT_TRUE(c.hard_failure.empty()) << what << ": " << describe(c);
  EXPECT_LE(c.nmse, 1e-12) << what << ": " << describe(c);
}

}  // namespace attn::testing
