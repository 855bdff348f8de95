// The caller's page pools (attn::PagePool) as paged_attention and append_pages take them:
// checked field by field, then addressed as the kernels' cache::PageRows.
#pragma once

#include "attn/paged.hpp"
#include "cache/page_rows.hpp"

namespace attn::api {

// Each pool whole (positive sizes, data, int8 scales exactly when int8) and the two alike
// where one page holds both (dtype, layout, pages, page size, KV heads); names the field.
void check_pools(const PagePool& keys, const PagePool& values);

cache::PageRows rows_of(const PagePool& pool);

}  // namespace attn::api
