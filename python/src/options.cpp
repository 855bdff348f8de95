#include "options.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>

#include "attn/error.hpp"
#include "core/position_bias.hpp"

namespace nb = nanobind;
using namespace nb::literals;

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

BiasBuckets buckets_of(const std::string& name) {
  if (name == "clipped") return BiasBuckets::clipped;
  if (name == "t5") return BiasBuckets::t5;
  if (name == "t5_causal") return BiasBuckets::t5_causal;
  throw Error("position_bias.buckets: expected 'clipped', 't5' or 't5_causal', given '" + name +
              "'");
}

PositionBias position_bias_of(std::vector<double> table, Index columns, const std::string& buckets,
                              Index offset, Index max_distance) {
  return {std::move(table), columns, buckets_of(buckets), offset, max_distance};
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
      .def(
          "set_position_bias",
          [](Options& o, std::vector<double> table, Index columns, const std::string& buckets,
             Index offset, Index max_distance) {
            o.position_bias =
                position_bias_of(std::move(table), columns, buckets, offset, max_distance);
          },
          "table"_a, "columns"_a, "buckets"_a, "offset"_a, "max_distance"_a,
          "Sets attn::Options::position_bias (table: [heads][columns] row-major).")
      .def_prop_ro("has_position_bias",
                   [](const Options& o) { return o.position_bias.has_value(); })
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

std::vector<Index> bias_columns(const std::string& buckets, Index columns, Index offset,
                                Index max_distance, const std::vector<Index>& distances) {
  PositionBias bias = position_bias_of({}, columns, buckets, offset, max_distance);
  // A table of zeros, for the checks of the other settings (columns first).
  if (columns > 0 && columns < (Index{1} << 30)) bias.table.assign(columns, 0.0);
  core::check_position_bias(bias, 1);
  std::vector<Index> out;
  out.reserve(distances.size());
  for (Index d : distances) out.push_back(bias_column(bias, d));
  return out;
}

Options with_mask(Options options, const std::optional<InputArray>& mask) {
  if (mask) options.mask = input_view(*mask, "mask", true);
  return options;
}

}  // namespace attn::python
