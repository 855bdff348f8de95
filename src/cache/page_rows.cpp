#include "cache/page_rows.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "cache/kv_cache_blocks.hpp"
#include "core/argument_checks.hpp"
#include "core/float8.hpp"

namespace attn::cache {

bool is_fp8(CacheDType dtype) {
  return dtype == CacheDType::fp8_e4m3 || dtype == CacheDType::fp8_e5m2;
}

bool has_scales(CacheDType dtype) {
  return dtype == CacheDType::int8 || dtype == CacheDType::int4;
}

bool holds_codes(CacheDType dtype) {
  return has_scales(dtype) || is_fp8(dtype);
}

Index row_bytes(CacheDType dtype, Index dim) {
  return dtype == CacheDType::int4 ? dim / 2 : dim * static_cast<Index>(element_bytes(dtype));
}

void check_int4_dims(const std::string& prefix, CacheDType dtype,
                     std::initializer_list<std::pair<const char*, Index>> dims) {
  if (dtype != CacheDType::int4) return;
  for (const auto& [name, dim] : dims) {
    if (dim % 32 != 0) {
      core::fail(prefix + name, "a multiple of 32 for int4 (blocks of 32 codes)",
                 std::to_string(dim));
    }
  }
}

void check_group(const std::string& name, CacheDType dtype, Index group,
                 std::initializer_list<Index> dims) {
  if (group == 0) return;
  if (!has_scales(dtype)) {
    core::fail(name, "0 (groups of scales are for int8 and int4)", std::to_string(group));
  }
  bool divides = true;
  for (const Index dim : dims) divides = divides && dim % group == 0;
  if ((group != 32 && group != 64 && group != 128) || !divides) {
    std::string shown;
    for (const Index dim : dims) shown += (shown.empty() ? "" : " and ") + std::to_string(dim);
    core::fail(name, "0 (a scale per row), or 32, 64 or 128 dividing the head dim (" + shown + ")",
               std::to_string(group));
  }
}

void check_zero_point(const std::string& name, CacheDType dtype, bool zero_point) {
  if (zero_point && !has_scales(dtype)) {
    core::fail(name,
               std::string("false for ") + cache_dtype_name(dtype) +
                   " (zero points are for int8 and int4)",
               "true");
  }
}

void check_head_scales(const std::string& name, const float* scales, Index heads) {
  for (Index h = 0; h < heads; ++h) {
    if (!(std::isfinite(scales[h]) && scales[h] > 0.0f)) {
      core::fail(name, "a positive finite scale per KV head",
                 std::to_string(scales[h]) + " for head " + std::to_string(h));
    }
  }
}

float code_value(int code, const float* row_scales, Index g, bool zero_point) {
  if (!zero_point) return static_cast<float>(code) * row_scales[g];
  return std::fma(static_cast<float>(code), row_scales[2 * g], row_scales[2 * g + 1]);
}

void fp8_narrow(CacheDType dtype, const double* row, Index n, std::uint8_t* codes) {
  for (Index d = 0; d < n; ++d) {
    codes[d] =
        dtype == CacheDType::fp8_e4m3 ? to_float8_e4m3(row[d]).bits : to_float8_e5m2(row[d]).bits;
  }
}

void fp8_widen(CacheDType dtype, const std::uint8_t* codes, Index n, float* row) {
  for (Index d = 0; d < n; ++d) {
    row[d] = dtype == CacheDType::fp8_e4m3 ? to_float(float8_e4m3{codes[d]})
                                           : to_float(float8_e5m2{codes[d]});
  }
}

std::size_t element_bytes(CacheDType dtype) {
  return holds_codes(dtype) ? 1 : dtype_size(storage_dtype(dtype));
}

DType storage_dtype(CacheDType dtype) {
  switch (dtype) {
    case CacheDType::f16:
      return DType::f16;
    case CacheDType::bf16:
      return DType::bf16;
    case CacheDType::f32:
    case CacheDType::int8:
    case CacheDType::fp8_e4m3:
    case CacheDType::fp8_e5m2:
    case CacheDType::int4:
      return DType::f32;
  }
  return DType::f32;
}

std::byte* PageRows::rows(std::int32_t page, Index head) const {
  if (cache != nullptr) return BlockAccess::writable_rows(*cache, page, head, values);
  return data + page * page_bytes + head * head_bytes;
}

float& PageRows::scale_ref(std::int32_t page, Index head, Index slot) const {
  if (cache != nullptr && scales == nullptr)
    return BlockAccess::scale_ref(*cache, page, head, slot, values);
  return scales[page * page_scales + head * head_scales + slot * slot_scales];
}

PageRows page_rows_of(const KVCache& cache, bool values) {
  const KVCacheConfig& config = cache.config();
  PageRows rows;
  rows.dtype = config.dtype_of(values);
  rows.page_size = config.page_size;
  rows.heads_kv = config.heads_kv;
  rows.dim = config.dim_of(values);
  rows.cache = &cache;
  rows.values = values;
  if (has_scales(rows.dtype)) {
    rows.group = config.group;
    rows.zero_point = config.zero_point;
  }
  rows.slot_bytes = row_bytes(rows.dtype, rows.dim);
  rows.head_bytes = rows.page_size * rows.slot_bytes;
  rows.slot_scales = rows.row_scales();
  const std::vector<float>& head_scales = config.head_scales(values);
  if (is_fp8(rows.dtype) && !head_scales.empty()) {
    // Read through the cache's config, never written.
    rows.scales = const_cast<float*>(head_scales.data());
    rows.head_scales = 1;
    rows.slot_scales = 0;
  }
  return rows;
}

}  // namespace attn::cache
