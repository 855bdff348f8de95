#include "options.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>

#include "attn/error.hpp"

namespace nb = nanobind;

namespace attn::python {
namespace {

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::fast:
      return "fast";
    case Backend::reference:
      return "reference";
    default:
      return "automatic";
  }
}

PvPrecision pv_precision_of(const std::string& name) {
  if (name == "exact") return PvPrecision::exact;
  if (name == "bf16") return PvPrecision::bf16;
  throw Error("pv_precision: expected 'exact' or 'bf16', given '" + name + "'");
}

Backend backend_of(const std::string& name) {
  if (name == "automatic") return Backend::automatic;
  if (name == "fast") return Backend::fast;
  if (name == "reference") return Backend::reference;
  throw Error("backend: expected 'automatic', 'fast' or 'reference', given '" + name + "'");
}

}  // namespace

void bind_options(nb::module_& m) {
  nb::class_<Options>(m, "Options",
                      "attn::Options without the mask (an array each call takes beside it).")
      .def(nb::init<>())
      .def_rw("scale", &Options::scale)
      .def_rw("causal", &Options::causal)
      .def_prop_rw(
          "bottom_right",
          [](const Options& o) { return o.causal_align == CausalAlign::bottom_right; },
          [](Options& o, bool bottom_right) {
            o.causal_align = bottom_right ? CausalAlign::bottom_right : CausalAlign::top_left;
          })
      .def_rw("position_offset", &Options::position_offset)
      .def_prop_rw(
          "window", [](const Options& o) { return std::make_tuple(o.window.left, o.window.right); },
          [](Options& o, std::tuple<Index, Index> window) {
            o.window = {std::get<0>(window), std::get<1>(window)};
          })
      .def_rw("softcap", &Options::softcap)
      .def_rw("alibi_slopes", &Options::alibi_slopes)
      .def_rw("sinks", &Options::sinks)
      .def_rw("cu_seqlens_q", &Options::cu_seqlens_q)
      .def_rw("cu_seqlens_k", &Options::cu_seqlens_k)
      .def_rw("threads", &Options::threads)
      .def_rw("block_mask", &Options::block_mask)
      .def_rw("dropout_p", &Options::dropout_p)
      .def_rw("dropout_seed", &Options::dropout_seed)
      .def_prop_rw(
          "pv_precision",
          [](const Options& o) {
            return std::string(o.pv_precision == PvPrecision::bf16 ? "bf16" : "exact");
          },
          [](Options& o, const std::string& name) { o.pv_precision = pv_precision_of(name); })
      .def_prop_rw(
          "backend", [](const Options& o) { return std::string(backend_name(o.backend)); },
          [](Options& o, const std::string& name) { o.backend = backend_of(name); });
}

Options with_mask(Options options, const std::optional<InputArray>& mask) {
  if (mask) options.mask = input_view(*mask, "mask", true);
  return options;
}

}  // namespace attn::python
