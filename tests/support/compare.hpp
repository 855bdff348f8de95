// One error metric against float64 (normalised mean squared error, plus max abs error),
// after hard checks: no NaN, infinities where and only where the reference has them.
#pragma once

#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::testing {

struct Comparison {
  double nmse = 0.0;         // sum (got - want)^2 / sum want^2 (over finite entries)
  double max_abs = 0.0;      // max |got - want| (over finite entries)
  std::string hard_failure;  // non-empty when a NaN or infinity mismatch was found
};

Comparison compare(const TensorView& got, const TensorView& want);

std::string describe(const Comparison& c);

// Output storage with guard bytes on both sides, to catch writes past the ends.
class GuardedTensor {
 public:
  GuardedTensor(DType dtype, const Dims& shape);
  MutableTensorView view();
  TensorView const_view() const;
  bool guards_intact() const;

 private:
  static constexpr std::size_t kGuardBytes = 256;
  static constexpr unsigned char kGuardByte = 0xA5;
  DType dtype_;
  Dims shape_;
  std::vector<unsigned char> bytes_;
};

}  // namespace attn::testing
