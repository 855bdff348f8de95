// The shape of every rejection in attn: "<argument>: expected <what>, given <what>".
#pragma once

#include <string>
#include <vector>

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn::core {

// Throws attn::Error("<argument>: expected <expected>, given <given>").
[[noreturn]] void fail(const std::string& argument, const std::string& expected,
                       const std::string& given);

// Any dtype but boolean.
void check_float_dtype(const char* name, DType dtype);

// Rows the kernels can read: a contiguous last dim (stride 1) when it holds more than one
// element, and data unless the view is empty.
void check_storage(const char* name, const TensorView& t);

// An output the caller provides: a floating-point dtype, the expected shape, a contiguous
// last dim, and data unless it is empty.
void check_output(const char* name, const MutableTensorView& t, const Dims& shape);

// An empty list, or one value per query head, each finite (or -inf when allowed).
void check_per_head(const char* name, const std::vector<float>& values, Index heads,
                    bool allow_minus_infinity);

// Sinks: none, or one per query head, each finite or -inf.
void check_sinks(const std::vector<float>& sinks, Index heads_q);

// The option values that every entry point reads the same way: scale, position_offset, window,
// softcap, alibi_slopes and sinks (one per query head) and threads. Which of mask, cu_seqlens and
// backend apply is the entry point's to check.
void check_options(const Options& options, Index heads_q);

// Options::scale, or the default 1/sqrt(dim) (dim: the query/key head dim).
double resolved_scale(const Options& options, Index dim);

}  // namespace attn::core
