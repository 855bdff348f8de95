#include "errors.hpp"

#include <exception>
#include <string>

#include "attn/error.hpp"
#include "attn/explain.hpp"

namespace attn::python {

void translate_errors(nanobind::handle error_type) {
  nanobind::register_exception_translator(
      [](const std::exception_ptr& error, void* type) {
        try {
          std::rethrow_exception(error);
        } catch (const attn::OutOfMemory& e) {
          PyErr_SetString(PyExc_MemoryError, e.what());
        } catch (const attn::Error& e) {
          PyErr_SetString(static_cast<PyObject*>(type), e.what());
        }
      },
      error_type.ptr());
}

}  // namespace attn::python

namespace attn::python {
namespace {

PyObject* fallback_warning = nullptr;
thread_local std::string pending_notice;

void keep_notice(const std::string& line) {
  pending_notice = line;
}

}  // namespace

void route_fallback_notices(nanobind::handle warning_type) {
  fallback_warning = warning_type.ptr();
  attn::set_fallback_notice(keep_notice);
}

void warn_fallback() {
  if (pending_notice.empty()) return;
  const std::string line = std::move(pending_notice);
  pending_notice.clear();
  if (PyErr_WarnEx(fallback_warning, line.c_str(), 2) < 0) throw nanobind::python_error();
}

}  // namespace attn::python
