// Bindings of the attention state (State, merge, finalize, forward_state), the paged
// KVCache and decode. States cross as three arrays m, l [B, H, Lq, 1] and acc
// [B, H, Lq, Dv]; the Python layer (attn/_generation.py) wraps them in attn.State.
#include "generation.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attn/attn.hpp"
#include "cache/page_rows.hpp"
#include "errors.hpp"
#include "options.hpp"
#include "views.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace attn::python {
namespace {

using StateArrays = std::tuple<NumpyArray, NumpyArray, NumpyArray>;

// view: [B, H, S, D], any strides with a contiguous last dim -> an owning contiguous copy.
Tensor copy_of(const TensorView& view) {
  Tensor copy(view.dtype, view.shape);
  const std::size_t row_bytes = static_cast<std::size_t>(view.shape[3]) * dtype_size(view.dtype);
  auto* to = static_cast<std::byte*>(copy.data());
  for (Index b = 0; b < view.shape[0]; ++b)
    for (Index h = 0; h < view.shape[1]; ++h)
      for (Index s = 0; s < view.shape[2]; ++s) {
        const auto* from = static_cast<const std::byte*>(view.data) +
                           (b * view.strides[0] + h * view.strides[1] + s * view.strides[2]) *
                               static_cast<Index>(dtype_size(view.dtype));
        std::memcpy(to, from, row_bytes);
        to += row_bytes;
      }
  return copy;
}

State state_of(const InputArray& m, const InputArray& l, const InputArray& acc, const char* name) {
  const std::string base(name);
  return State{copy_of(input_view(m, (base + ".m").c_str())),
               copy_of(input_view(l, (base + ".l").c_str())),
               copy_of(input_view(acc, (base + ".acc").c_str()))};
}

StateArrays arrays_of(State&& s) {
  return {to_numpy(std::move(s.m)), to_numpy(std::move(s.l)), to_numpy(std::move(s.acc))};
}

StateArrays merge_states(const InputArray& m_a, const InputArray& l_a, const InputArray& acc_a,
                         const InputArray& m_b, const InputArray& l_b, const InputArray& acc_b) {
  const State a = state_of(m_a, l_a, acc_a, "a"), b = state_of(m_b, l_b, acc_b, "b");
  State merged;
  {
    nb::gil_scoped_release unlocked;
    merged = merge(a, b);
  }
  return arrays_of(std::move(merged));
}

std::tuple<NumpyArray, NumpyArray> finalize_state(const InputArray& m, const InputArray& l,
                                                  const InputArray& acc, std::vector<float> sinks) {
  const State s = state_of(m, l, acc, "state");
  Finalized result = finalize(s, sinks);
  return {to_numpy(std::move(result.context)), to_numpy(std::move(result.lse))};
}

StateArrays empty_state(const std::string& dtype, Index batch, Index heads, Index rows,
                        Index dim_v) {
  if (dtype != "float32" && dtype != "float64") {
    throw Error("dtype: expected 'float32' or 'float64', given '" + dtype + "'");
  }
  return arrays_of(
      State::empty(dtype == "float32" ? DType::f32 : DType::f64, batch, heads, rows, dim_v));
}

// q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]  mask: [B or 1, Hq or 1, Lq, Lk]
StateArrays forward_state_arrays(const InputArray& q, const InputArray& k, const InputArray& v,
                                 const std::optional<InputArray>& mask, const Options& options) {
  const Options with = with_mask(options, mask);
  const TensorView q_view = input_view(q, "q"), k_view = input_view(k, "k");
  const TensorView v_view = input_view(v, "v");
  State s;
  {
    nb::gil_scoped_release unlocked;
    s = forward_state(q_view, k_view, v_view, with);
  }
  warn_fallback();
  return arrays_of(std::move(s));
}

CacheDType cache_dtype(const std::string& name) {
  if (name == "float32") return CacheDType::f32;
  if (name == "float16") return CacheDType::f16;
  if (name == "bfloat16") return CacheDType::bf16;
  if (name == "int8") return CacheDType::int8;
  if (name == "fp8_e4m3") return CacheDType::fp8_e4m3;
  if (name == "fp8_e5m2") return CacheDType::fp8_e5m2;
  if (name == "int4") return CacheDType::int4;
  throw Error(
      "dtype: expected 'float32', 'float16', 'bfloat16', 'int8', 'int4', 'fp8_e4m3' or "
      "'fp8_e5m2', "
      "given '" +
      name + "'");
}

// q: [S, Hq, n_q, D] -> (context [S, Hq, n_q, Dv], lse [S, Hq, n_q, 1]), or the state's
// (m, l, acc) when as_state.
nb::tuple decode_arrays(const InputArray& q, const KVCache& cache,
                        const std::vector<KVCache::SequenceId>& seq_ids, const Options& options,
                        bool as_state) {
  const TensorView q_view = input_view(q, "q");
  if (as_state) {
    State s;
    {
      nb::gil_scoped_release unlocked;
      s = decode_state(q_view, cache, seq_ids, options);
    }
    auto [m, l, acc] = arrays_of(std::move(s));
    return nb::make_tuple(m, l, acc);
  }
  Decoded result;
  {
    nb::gil_scoped_release unlocked;
    result = decode(q_view, cache, seq_ids, options);
  }
  return nb::make_tuple(to_numpy(std::move(result.context)), to_numpy(std::move(result.lse)));
}

// view: [S, H, n, D] -> its row s as [1, H, n, D], the same memory.
TensorView row_of(const TensorView& view, Index s) {
  const auto* data = static_cast<const std::byte*>(view.data) +
                     s * view.strides[0] * static_cast<Index>(dtype_size(view.dtype));
  return TensorView(data, view.dtype, {1, view.shape[1], view.shape[2], view.shape[3]},
                    view.strides);
}

// seq: S distinct ids  k: [S, Hkv, n, dim]  v: [S, Hkv, n, dim_v]: k[s] and v[s] go to
// seq[s], one append each, in order, under one release of the GIL. The Python layer
// (KVCache.append) has checked the ids and shapes; what can still fail is the pool (max_blocks,
// memory), and then the sequences before the failing one keep their new tokens.
void append_batch(KVCache& cache, const std::vector<KVCache::SequenceId>& seq, const InputArray& k,
                  const InputArray& v) {
  const TensorView k_view = input_view(k, "k"), v_view = input_view(v, "v");
  const auto count = static_cast<Index>(seq.size());
  if (k_view.shape[0] != count || v_view.shape[0] != count) {
    throw Error("k, v: expected " + std::to_string(count) + " rows (one per id of seq), given " +
                std::to_string(k_view.shape[0]) + " and " + std::to_string(v_view.shape[0]));
  }
  nb::gil_scoped_release unlocked;
  for (Index s = 0; s < count; ++s) {
    try {
      cache.append(seq[static_cast<std::size_t>(s)], row_of(k_view, s), row_of(v_view, s));
    } catch (const OutOfMemory& error) {
      if (s == 0) throw;
      throw OutOfMemory("seq[" + std::to_string(s) + "]: " + error.what() +
                        " (seq[0:" + std::to_string(s) + "] were appended)");
    } catch (const Error& error) {
      if (s == 0) throw;
      throw Error("seq[" + std::to_string(s) + "]: " + error.what() +
                  " (seq[0:" + std::to_string(s) + "] were appended)");
    }
  }
}

using ReadOnlyArray = nb::ndarray<nb::numpy, nb::ro>;

// One of cache_pools' pools ([pages, Hkv, page_size, dim], head-major) or its int8 and int4
// scales ([pages, Hkv, page_size], or [pages, Hkv, page_size, dim / group] with groups; with
// zero points, [pages, Hkv, page_size, groups, 2]: (scale, offset) pairs, groups 1 for one a
// row), or its fp8 head scales ([Hkv]), as a read-only NumPy array on the cache's memory,
// keeping the cache alive.
ReadOnlyArray pool_array(const PagePool& pool, nb::handle owner, bool scales) {
  const auto pages = static_cast<std::size_t>(pool.pages);
  const auto heads = static_cast<std::size_t>(pool.heads_kv);
  if (scales && cache::is_fp8(pool.dtype)) {
    return ReadOnlyArray(pool.scales, 1, &heads, owner, nullptr, nb::dtype<float>());
  }
  if (scales) {
    const std::size_t shape[5] = {
        pages, heads, static_cast<std::size_t>(pool.page_size),
        static_cast<std::size_t>(pool.group > 0 ? pool.dim / pool.group : 1), 2};
    const std::size_t dims = pool.zero_point ? 5 : pool.group > 0 ? 4 : 3;
    return ReadOnlyArray(pool.scales, dims, shape, owner, nullptr, nb::dtype<float>());
  }
  // int4: the bytes of each row, two codes each.
  const std::size_t shape[4] = {
      pages, heads, static_cast<std::size_t>(pool.page_size),
      static_cast<std::size_t>(cache::row_bytes(pool.dtype, pool.dim) /
                               static_cast<Index>(cache::element_bytes(pool.dtype)))};
  const nb::dlpack::dtype dtype = pool.dtype == CacheDType::int8 ? nb::dtype<std::int8_t>()
                                  : cache::is_fp8(pool.dtype) || pool.dtype == CacheDType::int4
                                      ? nb::dtype<std::uint8_t>()
                                      : numpy_dtype(cache::storage_dtype(pool.dtype));
  return ReadOnlyArray(pool.data, 4, shape, owner, nullptr, dtype);
}

// (key_cache, value_cache, key_scales, value_scales): scales None unless int8 or int4.
nb::tuple pools_of(KVCache& cache) {
  const CachePools pools = cache_pools(cache);
  const nb::handle owner = nb::find(&cache);
  const auto scales = [&](const PagePool& pool) {
    return pool.scales != nullptr ? nb::object(nb::cast(pool_array(pool, owner, true)))
                                  : nb::none();
  };
  return nb::make_tuple(pool_array(pools.keys, owner, false),
                        pool_array(pools.values, owner, false), scales(pools.keys),
                        scales(pools.values));
}

// (block_table [S, max_pages] int32, seq_lens [S] int32) of the ids, read at one moment:
// rows padded with 0 past a sequence's last page (paged_attention does not read them).
nb::tuple block_tables_of(const KVCache& cache, const std::vector<KVCache::SequenceId>& ids) {
  std::vector<std::int32_t> table, seq_lens;
  std::size_t max_pages = 0;
  {
    const KVCache::Reading reading = cache.read(ids, "seq_ids");
    for (std::size_t s = 0; s < ids.size(); ++s) {
      max_pages = std::max(max_pages, reading.block_table(s).size());
    }
    table.assign(ids.size() * max_pages, 0);
    for (std::size_t s = 0; s < ids.size(); ++s) {
      const std::vector<std::int32_t>& row = reading.block_table(s);
      std::copy(row.begin(), row.end(), table.begin() + static_cast<std::ptrdiff_t>(s * max_pages));
      seq_lens.push_back(static_cast<std::int32_t>(reading.length(s)));
    }
  }
  const auto owned = [](std::vector<std::int32_t>&& values, std::size_t ndim,
                        const std::size_t* shape) {
    auto* held = new std::vector<std::int32_t>(std::move(values));
    nb::capsule owner(held,
                      [](void* p) noexcept { delete static_cast<std::vector<std::int32_t>*>(p); });
    return nb::ndarray<nb::numpy, std::int32_t>(held->data(), ndim, shape, owner);
  };
  const std::size_t table_shape[2] = {ids.size(), max_pages};
  const std::size_t lens_shape[1] = {ids.size()};
  return nb::make_tuple(owned(std::move(table), 2, table_shape),
                        owned(std::move(seq_lens), 1, lens_shape));
}

}  // namespace

void bind_generation(nb::module_& m) {
  m.def("merge_states", &merge_states, "m_a"_a, "l_a"_a, "acc_a"_a, "m_b"_a, "l_b"_a, "acc_b"_a,
        "The merged state (m, l, acc) of two states over disjoint keys.");
  m.def("finalize_state", &finalize_state, "m"_a, "l"_a, "acc"_a, "sinks"_a,
        "(context, lse) of a state, with the sinks counted once.");
  m.def("empty_state", &empty_state, "dtype"_a, "batch"_a, "heads"_a, "rows"_a, "dim_v"_a,
        "The state (m, l, acc) of no keys.");
  m.def("forward_state", &forward_state_arrays, "q"_a, "k"_a, "v"_a, nb::kw_only(), "mask"_a.none(),
        "options"_a, "Attention of 4-D views as a state (m, l, acc).");
  m.def("decode", &decode_arrays, "q"_a, "cache"_a, "seq_ids"_a, nb::kw_only(), "options"_a,
        "as_state"_a, "One decode step of 4-D q against the cache.");

  nb::class_<KVCache>(m, "KVCache")
      .def(
          "__init__",
          [](KVCache* self, Index heads_kv, Index dim, Index dim_v, Index page_size,
             const std::string& dtype, const std::string& dtype_v, Index group, bool zero_point,
             Index max_blocks, const std::vector<float>& k_scale,
             const std::vector<float>& v_scale) {
            new (self) KVCache({.heads_kv = heads_kv,
                                .dim = dim,
                                .dim_v = dim_v,
                                .page_size = page_size,
                                .dtype = cache_dtype(dtype),
                                .dtype_v = cache_dtype(dtype_v),
                                .group = group,
                                .zero_point = zero_point,
                                .max_blocks = max_blocks,
                                .k_scale = k_scale,
                                .v_scale = v_scale});
          },
          "heads_kv"_a, "dim"_a, "dim_v"_a, "page_size"_a, "dtype"_a, "dtype_v"_a, "group"_a,
          "zero_point"_a, "max_blocks"_a, "k_scale"_a, "v_scale"_a)
      .def("add_sequence", &KVCache::add_sequence)
      .def("fork", &KVCache::fork, "parent"_a)
      .def(
          "append",
          [](KVCache& cache, KVCache::SequenceId seq, const InputArray& k, const InputArray& v) {
            const TensorView k_view = input_view(k, "k"), v_view = input_view(v, "v");
            nb::gil_scoped_release unlocked;
            cache.append(seq, k_view, v_view);
          },
          "seq"_a, "k"_a, "v"_a)
      .def("append_batch", &append_batch, "seq"_a, "k"_a, "v"_a)
      .def("drop", &KVCache::drop, "seq"_a)
      .def("contains", &KVCache::contains, "seq"_a)
      .def("length", &KVCache::length, "seq"_a)
      .def("sequence_ids", &KVCache::sequence_ids)
      .def("block_table", &KVCache::block_table, "seq"_a)
      .def("ref_count", &KVCache::ref_count, "block"_a)
      .def("pools", &pools_of)
      .def("block_tables", &block_tables_of, "seq_ids"_a)
      .def_prop_ro("blocks_allocated", &KVCache::blocks_allocated)
      .def_prop_ro("blocks_free", &KVCache::blocks_free)
      .def_prop_ro("blocks_in_use", &KVCache::blocks_in_use)
      .def(
          "keys",
          [](const KVCache& cache, KVCache::SequenceId seq) { return to_numpy(cache.keys(seq)); },
          "seq"_a)
      .def(
          "values",
          [](const KVCache& cache, KVCache::SequenceId seq) { return to_numpy(cache.values(seq)); },
          "seq"_a)
      .def_prop_ro("heads_kv", [](const KVCache& c) { return c.config().heads_kv; })
      .def_prop_ro("dim", [](const KVCache& c) { return c.config().dim; })
      .def_prop_ro("dim_v", [](const KVCache& c) { return c.config().dim_v; })
      .def_prop_ro("page_size", [](const KVCache& c) { return c.config().page_size; })
      .def_prop_ro("max_blocks", [](const KVCache& c) { return c.config().max_blocks; })
      .def_prop_ro("group", [](const KVCache& c) { return c.config().group; })
      .def_prop_ro("zero_point", [](const KVCache& c) { return c.config().zero_point; })
      .def_prop_ro("k_scale", [](const KVCache& c) { return c.config().k_scale; })
      .def_prop_ro("v_scale", [](const KVCache& c) { return c.config().v_scale; })
      .def_prop_ro("dtype", [](const KVCache& c) { return cache_dtype_name(c.config().dtype); })
      .def_prop_ro("dtype_v",
                   [](const KVCache& c) { return cache_dtype_name(c.config().dtype_of(true)); });
}

}  // namespace attn::python
