// The shape of every rejection in attn: "<argument>: expected <what>, given <what>".
#pragma once

#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::core {

// Throws attn::Error("<argument>: expected <expected>, given <given>").
[[noreturn]] void fail(const std::string& argument, const std::string& expected,
                       const std::string& given);

// An output the caller provides: a floating-point dtype, the expected shape, a contiguous
// last dim, and data unless it is empty.
void check_output(const char* name, const MutableTensorView& t, const Dims& shape);

// An empty list, or one value per query head, each finite (or -inf when allowed).
void check_per_head(const char* name, const std::vector<float>& values, Index heads,
                    bool allow_minus_infinity);

}  // namespace attn::core
