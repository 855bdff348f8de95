// How C++ errors reach Python, the same in every extension module of the package.
#pragma once

#include <nanobind/nanobind.h>

namespace attn::python {

// Raises attn::OutOfMemory as MemoryError and any other attn::Error as error_type (attn.Error,
// which attn._attn creates).
void translate_errors(nanobind::handle error_type);

}  // namespace attn::python
