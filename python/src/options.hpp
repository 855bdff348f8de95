// attn::Options crosses the binding once, as the class attn._attn.Options: attn/_request.py
// builds it from the keywords every entry point shares, and each extension function takes
// it whole. Its values are checked in core, as for C++ callers (core::check_options).
#pragma once

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <vector>

#include "attn/options.hpp"
#include "views.hpp"

namespace attn::python {

void bind_options(nanobind::module_& m);

// The column of a position bias table (attn::bias_column) that each distance reads, after
// the checks that options would make of these settings.
std::vector<Index> bias_columns(const std::string& buckets, Index columns, Index offset,
                                Index max_distance, const std::vector<Index>& distances);

// The options with the mask read from `mask` ([B or 1, Hq or 1, Lq, Lk]), which must
// outlive the call.
Options with_mask(Options options, const std::optional<InputArray>& mask);

}  // namespace attn::python
