#include "paged.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "attn/attn.hpp"
#include "views.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace attn::python {
namespace {

using Ints = nb::ndarray<const std::int32_t, nb::c_contig, nb::device::cpu>;
using Slots = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// Pools and scales are written in place by append_pages: bound without conversion (a
// converted copy would take the writes), their layout checked here. paged_attention only
// reads them, so it also takes read-only arrays (a KVCache's pools).
using Scales = nb::ndarray<float, nb::device::cpu>;
using Pool = nb::ndarray<>;
using ReadScales = nb::ndarray<const float, nb::device::cpu>;
using ReadPool = nb::ndarray<nb::ro>;

[[noreturn]] void fail(const std::string& name, const std::string& expected,
                       const std::string& given) {
  throw Error(name + ": expected " + expected + ", given " + given);
}

template <class Array>
void check_contiguous(const Array& array, const std::string& name) {
  std::int64_t expected = 1;
  for (std::size_t axis = array.ndim(); axis-- > 0;) {
    if (array.shape(axis) > 1 && array.stride(axis) != expected) {
      fail(name, "a C-contiguous array (it is read and written in place)",
           "stride " + std::to_string(array.stride(axis)) + " on axis " + std::to_string(axis));
    }
    expected *= static_cast<std::int64_t>(array.shape(axis));
  }
}

PageLayout layout_of(const std::string& name) {
  if (name == "token_major") return PageLayout::token_major;
  if (name == "head_major") return PageLayout::head_major;
  throw Error("layout: expected 'token_major' or 'head_major', given '" + name + "'");
}

// kv_cache_dtype: "auto" (the array's dtype says), or "fp8_e4m3" / "fp8_e5m2" for uint8
// arrays of fp8 codes (vLLM's kv_cache_dtype; the Python layer passes float8 arrays so), or
// "int4" for uint8 arrays of int4 code pairs.
template <class Array>
CacheDType pool_dtype(const Array& pool, const char* name, const std::string& kv_cache_dtype) {
  using Code = nb::dlpack::dtype_code;
  const nb::dlpack::dtype dtype = pool.dtype();
  const auto code = static_cast<Code>(dtype.code);
  const bool bytes = dtype.lanes == 1 && code == Code::UInt && dtype.bits == 8;
  if (kv_cache_dtype == "fp8_e4m3" || kv_cache_dtype == "fp8_e5m2" || kv_cache_dtype == "int4") {
    if (!bytes) {
      throw nb::type_error((std::string(name) + ": expected dtype uint8 (codes) for " +
                            "kv_cache_dtype '" + kv_cache_dtype + "'")
                               .c_str());
    }
    return kv_cache_dtype == "fp8_e4m3"   ? CacheDType::fp8_e4m3
           : kv_cache_dtype == "fp8_e5m2" ? CacheDType::fp8_e5m2
                                          : CacheDType::int4;
  }
  if (kv_cache_dtype != "auto") {
    fail("kv_cache_dtype", "'auto', 'fp8_e4m3', 'fp8_e5m2' or 'int4'", "'" + kv_cache_dtype + "'");
  }
  if (dtype.lanes == 1) {
    if (code == Code::Float && dtype.bits == 32) return CacheDType::f32;
    if (code == Code::Float && dtype.bits == 16) return CacheDType::f16;
    if ((code == Code::Bfloat || code == Code::UInt) && dtype.bits == 16) return CacheDType::bf16;
    if (code == Code::Int && dtype.bits == 8) return CacheDType::int8;
  }
  throw nb::type_error((std::string(name) +
                        ": expected dtype float32, float16, bfloat16, int8 or float8 (uint8 " +
                        "with kv_cache_dtype 'fp8_e4m3' or 'fp8_e5m2')")
                           .c_str());
}

// A pool array [pages, page_size, Hkv, D] (token_major) or [pages, Hkv, page_size, D]
// (head_major), C-contiguous in CPU memory, with its int8 or int4 scales, one per token and KV
// head ([pages, page_size, Hkv] or [pages, Hkv, page_size]: the pool's layout without D) or
// per group of each row ([..., D / group]), or with zero points (scale, offset) pairs per
// group ([..., G, 2], G = 1 for one pair a row); or its fp8 scales, one per KV head ([Hkv]).
// PagePool holds mutable pointers for append_pages; paged_attention's read-only arrays are only
// read.
template <class Array, class ScalesArray>
PagePool pool_of(const Array& array, const char* name, PageLayout layout,
                 const std::string& kv_cache_dtype, const std::optional<ScalesArray>& scales,
                 const char* scales_name) {
  if (array.device_type() != nb::device::cpu::value) {
    fail(name, "an array in CPU memory",
         "an array on DLPack device type " + std::to_string(array.device_type()));
  }
  if (array.ndim() != 4) fail(name, "4 dims", std::to_string(array.ndim()) + " dims");
  check_contiguous(array, name);
  PagePool pool;
  pool.data = const_cast<void*>(static_cast<const void*>(array.data()));
  pool.dtype = pool_dtype(array, name, kv_cache_dtype);
  pool.layout = layout;
  const bool token_major = layout == PageLayout::token_major;
  pool.pages = static_cast<Index>(array.shape(0));
  pool.page_size = static_cast<Index>(array.shape(token_major ? 1 : 2));
  pool.heads_kv = static_cast<Index>(array.shape(token_major ? 2 : 1));
  // int4: the last dim holds bytes, two codes each.
  pool.dim = static_cast<Index>(array.shape(3)) * (pool.dtype == CacheDType::int4 ? 2 : 1);
  if (!scales) return pool;
  check_contiguous(*scales, scales_name);
  pool.scales = const_cast<float*>(scales->data());
  std::string given = "[";
  for (std::size_t d = 0; d < scales->ndim(); ++d) {
    given += (d ? ", " : "") + std::to_string(scales->shape(d));
  }
  given += "]";
  if (pool.dtype == CacheDType::fp8_e4m3 || pool.dtype == CacheDType::fp8_e5m2) {
    if (scales->ndim() != 1 || static_cast<Index>(scales->shape(0)) != pool.heads_kv) {
      fail(scales_name,
           "shape [" + std::to_string(pool.heads_kv) + "] (one scale per KV head of " + name +
               ", for fp8)",
           given);
    }
    return pool;
  }
  // A fourth dim holds each row's groups of scales: their count says the group. A fifth of
  // 2 makes them (scale, offset) pairs.
  const std::size_t dims = scales->ndim();
  const Index groups = dims >= 4 ? static_cast<Index>(scales->shape(3)) : 1;
  const Index wanted[3] = {pool.pages, token_major ? pool.page_size : pool.heads_kv,
                           token_major ? pool.heads_kv : pool.page_size};
  bool fits = dims == 3 || ((dims == 4 || (dims == 5 && scales->shape(4) == 2)) && groups > 0 &&
                            pool.dim % groups == 0);
  for (std::size_t d = 0; d < std::min<std::size_t>(dims, 3); ++d) {
    fits = fits && static_cast<Index>(scales->shape(d)) == wanted[d];
  }
  if (!fits) {
    fail(scales_name,
         "shape [" + std::to_string(wanted[0]) + ", " + std::to_string(wanted[1]) + ", " +
             std::to_string(wanted[2]) + "] (one scale per token and KV head of " + name +
             ", in its layout) or that and the groups of each row, [..., " +
             std::to_string(pool.dim) + " / group], or with zero points [..., groups, 2]",
         given);
  }
  pool.zero_point = dims == 5;
  pool.group = dims == 4 || (dims == 5 && groups > 1) ? pool.dim / groups : 0;
  return pool;
}

using Table = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// The rotary of the keywords: a style name ("neox", "interleaved") or none, its tables
// [positions, dims / 2] and optional positions.
Rotary rotary_of(const std::optional<std::string>& style, Index dims,
                 const std::optional<Table>& cos, const std::optional<Table>& sin,
                 const std::optional<Ints>& positions) {
  Rotary rotary;
  if (style) {
    if (*style == "neox") {
      rotary.style = RotaryStyle::neox;
    } else if (*style == "interleaved") {
      rotary.style = RotaryStyle::interleaved;
    } else {
      throw Error("rotary: expected 'neox', 'interleaved' or None, given '" + *style + "'");
    }
  }
  rotary.dims = dims;
  if (cos) rotary.cos = {cos->data(), cos->size()};
  if (sin) rotary.sin = {sin->data(), sin->size()};
  if (positions) rotary.positions = {positions->data(), positions->size()};
  return rotary;
}

std::span<const std::int32_t> ints_of(const Ints& array, const char* name, std::size_t ndim) {
  if (array.ndim() != ndim) {
    fail(name, std::to_string(ndim) + " dims of int32", std::to_string(array.ndim()) + " dims");
  }
  return {array.data(), array.size()};
}

// q: [1, total_q, Hq, D] -> (context [1, total_q, Hq, Dv], lse [1, total_q, Hq, 1]).
nb::tuple paged_attention_arrays(const InputArray& q, const ReadPool& key_cache,
                                 const ReadPool& value_cache, const Ints& block_table,
                                 const Ints& seq_lens, const Ints& query_start,
                                 const std::string& layout, const std::string& key_cache_dtype,
                                 const std::string& value_cache_dtype,
                                 const std::optional<ReadScales>& key_scales,
                                 const std::optional<ReadScales>& value_scales,
                                 const Options& options, const std::optional<std::string>& rotary,
                                 Index rotary_dims, const std::optional<Table>& rotary_cos,
                                 const std::optional<Table>& rotary_sin,
                                 const std::optional<Ints>& positions) {
  const TensorView q_view = input_view(q, "q");
  const PageLayout pages = layout_of(layout);
  const PagePool keys =
      pool_of(key_cache, "key_cache", pages, key_cache_dtype, key_scales, "key_scales");
  const PagePool values =
      pool_of(value_cache, "value_cache", pages, value_cache_dtype, value_scales, "value_scales");
  const std::span<const std::int32_t> table = ints_of(block_table, "block_table", 2);
  const PagedBatch batch{ints_of(query_start, "query_start", 1), ints_of(seq_lens, "seq_lens", 1),
                         table,
                         block_table.ndim() == 2 ? static_cast<Index>(block_table.shape(1)) : 0};
  const Rotary rotation = rotary_of(rotary, rotary_dims, rotary_cos, rotary_sin, positions);
  PagedOutput result;
  {
    nb::gil_scoped_release unlocked;
    result = paged_attention(q_view, keys, values, batch, options, rotation);
  }
  return nb::make_tuple(to_numpy(std::move(result.context)), to_numpy(std::move(result.lse)));
}

// k: [1, n, Hkv, D]  v: [1, n, Hkv, Dv]  slots: [n] int64.
void append_pages_arrays(const InputArray& k, const InputArray& v, const Slots& slots,
                         Pool key_cache, Pool value_cache, const std::string& layout,
                         const std::string& key_cache_dtype, const std::string& value_cache_dtype,
                         const std::optional<Scales>& key_scales,
                         const std::optional<Scales>& value_scales,
                         const std::optional<std::string>& rotary, Index rotary_dims,
                         const std::optional<Table>& rotary_cos,
                         const std::optional<Table>& rotary_sin,
                         const std::optional<Ints>& positions) {
  const TensorView k_view = input_view(k, "k"), v_view = input_view(v, "v");
  const PageLayout pages = layout_of(layout);
  const PagePool keys =
      pool_of(key_cache, "key_cache", pages, key_cache_dtype, key_scales, "key_scales");
  const PagePool values =
      pool_of(value_cache, "value_cache", pages, value_cache_dtype, value_scales, "value_scales");
  const Rotary rotation = rotary_of(rotary, rotary_dims, rotary_cos, rotary_sin, positions);
  nb::gil_scoped_release unlocked;
  append_pages(k_view, v_view, {slots.data(), slots.size()}, keys, values, rotation);
}

}  // namespace

void bind_paged(nb::module_& m) {
  m.def("paged_attention", &paged_attention_arrays, "q"_a, "key_cache"_a.noconvert(),
        "value_cache"_a.noconvert(), "block_table"_a, "seq_lens"_a, "query_start"_a, nb::kw_only(),
        "layout"_a, "key_cache_dtype"_a, "value_cache_dtype"_a, "key_scales"_a.none().noconvert(),
        "value_scales"_a.none().noconvert(), "options"_a, "rotary"_a.none(), "rotary_dims"_a,
        "rotary_cos"_a.none(), "rotary_sin"_a.none(), "positions"_a.none(),
        "Attention of packed queries over the caller's pages.");
  m.def("append_pages", &append_pages_arrays, "k"_a, "v"_a, "slots"_a, "key_cache"_a.noconvert(),
        "value_cache"_a.noconvert(), nb::kw_only(), "layout"_a, "key_cache_dtype"_a,
        "value_cache_dtype"_a, "key_scales"_a.none().noconvert(),
        "value_scales"_a.none().noconvert(), "rotary"_a.none(), "rotary_dims"_a,
        "rotary_cos"_a.none(), "rotary_sin"_a.none(), "positions"_a.none(),
        "New tokens written into the caller's pages at their slots.");
}

}  // namespace attn::python
