// attn._dist, the extension behind attn/dist.py: attn::dist::forward on this rank's shards,
// over a communicator that mpi4py made. It is a module of its own, built only where CMake
// found MPI, so that `import attn` never loads libmpi. Its functions take 4-D [B, H, S, D]
// arrays that the Python layer has shaped and checked (and agreed across ranks); the GIL is
// released while the ring runs.
#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/dist.hpp"
#include "errors.hpp"
#include "views.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace attn::python {
namespace {

// mpi4py's MPI._handleof(comm) is the MPI_Comm itself as an integer. It means the same
// communicator here only when mpi4py and this module share one libmpi, which attn/dist.py
// checks (library_version) before any call.
static_assert(std::is_pointer_v<MPI_Comm> && sizeof(MPI_Comm) == sizeof(std::uintptr_t),
              "Open MPI's MPI_Comm is a pointer; an MPI whose handle is an int (MPICH) needs "
              "static_cast instead");

MPI_Comm communicator(std::uintptr_t handle) {
  return reinterpret_cast<MPI_Comm>(handle);
}

// q: [B, Hq, Lq_r, D]  k: [B, Hkv, Lk_r, D]  v: [B, Hkv, Lk_r, Dv]: this rank's shards
// -> (context [B, Hq, Lq_r, Dv] in q's dtype, lse [B, Hq, Lq_r, 1]) for its rows
nb::tuple forward(std::uintptr_t comm, const InputArray& q, const InputArray& k,
                  const InputArray& v, bool zigzag, const Options& options) {
  const TensorView q_view = input_view(q, "q_local"), k_view = input_view(k, "k_local");
  const TensorView v_view = input_view(v, "v_local");
  const dist::Sharding sharding = zigzag ? dist::Sharding::zigzag : dist::Sharding::contiguous;
  Result result;
  {
    nb::gil_scoped_release unlocked;
    result = dist::forward(communicator(comm), q_view, k_view, v_view, options, sharding);
  }
  return nb::make_tuple(to_numpy(std::move(result.context)), to_numpy(std::move(result.lse)));
}

// The MPI this module was built against, as MPI_Get_library_version says (callable before
// MPI_Init): mpi4py's MPI.Get_library_version() must say the same.
std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

}  // namespace
}  // namespace attn::python

NB_MODULE(_dist, m) {
  using namespace attn::python;
  m.doc() = "attn's compiled attention over MPI; use attn.dist instead.";
  // attn::Error as attn._attn raises it: the one attn.Error of the package.
  const nb::object error_type = nb::module_::import_("attn._attn").attr("Error");
  m.attr("Error") = error_type;
  translate_errors(error_type);
  m.def("forward", &forward, "comm"_a, "q"_a, "k"_a, "v"_a, nb::kw_only(), "zigzag"_a, "options"_a,
        "Ring attention of this rank's 4-D [B, H, S, D] shards over the MPI_Comm handle comm; "
        "returns (context, lse).");
  m.def("library_version", &library_version, "The MPI library this module was built against.");
}
