// Bindings for generation: the attention state, the paged KVCache and decode.
#pragma once

#include <nanobind/nanobind.h>

namespace attn::python {

void bind_generation(nanobind::module_& m);

}  // namespace attn::python
