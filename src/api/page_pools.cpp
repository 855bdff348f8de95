#include "api/page_pools.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cache/kv_cache_blocks.hpp"
#include "core/argument_checks.hpp"

namespace attn {

const char* page_layout_name(PageLayout layout) {
  return layout == PageLayout::token_major ? "token_major" : "head_major";
}

CachePools cache_pools(KVCache& cache) {
  const KVCacheConfig& config = cache.config();
  if (config.max_blocks < 1) {
    core::fail("max_blocks",
               "a cache made with max_blocks > 0 (its blocks then lie in one allocation, which "
               "the pools show)",
               "a cache that grows (max_blocks 0)");
  }
  cache::BlockAccess::reserve_pool(cache);
  const auto pool = [&](bool values) {
    PagePool p;
    p.data = cache::BlockAccess::writable_rows(cache, 0, 0, values);
    p.dtype = config.dtype_of(values);
    p.layout = PageLayout::head_major;
    p.pages = config.max_blocks;
    p.page_size = config.page_size;
    p.heads_kv = config.heads_kv;
    p.dim = config.dim_of(values);
    if (cache::has_scales(p.dtype)) {
      p.scales = &cache::BlockAccess::scale_ref(cache, 0, 0, 0, values);
      p.group = config.group;
      p.zero_point = config.zero_point;
    }
    const std::vector<float>& head_scales = config.head_scales(values);
    if (!head_scales.empty()) p.scales = const_cast<float*>(head_scales.data());
    return p;
  };
  return {pool(false), pool(true)};
}

namespace api {

using core::fail;

namespace {

void check_pool(const char* name, const PagePool& pool) {
  const std::string n = name;
  for (const auto& [field, value] : {std::pair{".pages", pool.pages},
                                     {".page_size", pool.page_size},
                                     {".heads_kv", pool.heads_kv},
                                     {".dim", pool.dim}}) {
    if (value < 1) fail(n + field, "a positive count", std::to_string(value));
  }
  if (pool.data == nullptr) fail(n + ".data", "the pool's elements", "null");
  if (pool.pages > INT32_MAX) {
    fail(n + ".pages", "at most 2^31 - 1 (pages are int32 in the table)",
         std::to_string(pool.pages));
  }
  if (cache::is_fp8(pool.dtype) && pool.scales != nullptr) {
    cache::check_head_scales(n + ".scales", pool.scales, pool.heads_kv);
  } else if (cache::has_scales(pool.dtype) != (pool.scales != nullptr)) {
    fail(n + ".scales",
         cache::has_scales(pool.dtype)
             ? std::string("float32 scales for ") + cache_dtype_name(pool.dtype) +
                   ", one per token and KV head"
             : "null (scales are for int8, int4 and fp8 pools)",
         pool.scales == nullptr ? "null" : "scales");
  }
  cache::check_int4_dims(n, pool.dtype, {{".dim", pool.dim}});
  cache::check_group(n + ".group", pool.dtype, pool.group, {pool.dim});
  cache::check_zero_point(n + ".zero_point", pool.dtype, pool.zero_point);
}

}  // namespace

void check_pools(const PagePool& keys, const PagePool& values) {
  check_pool("keys", keys);
  check_pool("values", values);
  const auto agree = [&](const char* field, auto k, auto v, const std::string& shown_k,
                         const std::string& shown_v) {
    if (k != v) {
      fail(std::string("values.") + field, "the key pool's " + shown_k + " (one page holds both)",
           shown_v);
    }
  };
  agree("layout", keys.layout, values.layout, page_layout_name(keys.layout),
        page_layout_name(values.layout));
  agree("pages", keys.pages, values.pages, std::to_string(keys.pages),
        std::to_string(values.pages));
  agree("page_size", keys.page_size, values.page_size, std::to_string(keys.page_size),
        std::to_string(values.page_size));
  agree("heads_kv", keys.heads_kv, values.heads_kv, std::to_string(keys.heads_kv),
        std::to_string(values.heads_kv));
  // Pools of two dtypes read each side by its own format (the kernel widens the values).
  if (keys.dtype != values.dtype) return;
  // Symmetric int8 reads keys and values alike, per token or per group; int4 and zero points
  // read each side with its own groups (one a row, with a row of one group, is the same).
  if (keys.dtype == CacheDType::int8 && !keys.zero_point) {
    agree("group", keys.group, values.group, std::to_string(keys.group),
          std::to_string(values.group));
  }
  const auto shown = [](bool zero_point) { return zero_point ? "true" : "false"; };
  agree("zero_point", keys.zero_point, values.zero_point, shown(keys.zero_point),
        shown(values.zero_point));
}

cache::PageRows rows_of(const PagePool& pool) {
  cache::PageRows rows;
  rows.dtype = pool.dtype;
  rows.page_size = pool.page_size;
  rows.heads_kv = pool.heads_kv;
  rows.dim = pool.dim;
  rows.data = static_cast<std::byte*>(pool.data);
  rows.scales = pool.scales;
  rows.group = pool.group;
  rows.zero_point = pool.zero_point;
  const Index row = cache::row_bytes(pool.dtype, pool.dim);
  rows.page_bytes = pool.page_size * pool.heads_kv * row;
  const bool token_major = pool.layout == PageLayout::token_major;
  rows.head_bytes = token_major ? row : pool.page_size * row;
  rows.slot_bytes = token_major ? pool.heads_kv * row : row;
  if (rows.head_scaled()) {
    rows.head_scales = 1;
    return rows;
  }
  const Index groups = rows.row_scales();
  rows.page_scales = pool.page_size * pool.heads_kv * groups;
  rows.head_scales = token_major ? groups : pool.page_size * groups;
  rows.slot_scales = token_major ? pool.heads_kv * groups : groups;
  return rows;
}

}  // namespace api
}  // namespace attn
