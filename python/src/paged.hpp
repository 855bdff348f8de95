// Bindings of attention over the caller's pages (attn::paged_attention) and of appending
// into them (attn::append_pages). The pools, tables and scales are read and written where
// the caller holds them.
#pragma once

#include <nanobind/nanobind.h>

namespace attn::python {

void bind_paged(nanobind::module_& m);

}  // namespace attn::python
