// How C++ errors reach Python, the same in every extension module of the package.
#pragma once

#include <nanobind/nanobind.h>

namespace attn::python {

// Raises attn::OutOfMemory as MemoryError and any other attn::Error as error_type (attn.Error,
// which attn._attn creates).
void translate_errors(nanobind::handle error_type);

}  // namespace attn::python

namespace attn::python {

// Backend::automatic's line when it runs the reference (attn::set_fallback_notice) becomes a
// Python warning of warning_type (attn.FallbackWarning): the line is kept while the call
// runs without the GIL, and warn_fallback(), once the call holds it again, warns it.
void route_fallback_notices(nanobind::handle warning_type);
// Throws nanobind::python_error where the warnings filter turns the warning into an error.
void warn_fallback();

}  // namespace attn::python
