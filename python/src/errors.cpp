#include "errors.hpp"

#include <exception>

#include "attn/error.hpp"

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
