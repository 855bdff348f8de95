// One pool of pages (keys or values) as the paged kernel and the appends address it: the
// rows of a page and KV head, a fixed stride apart, and their int8 scales. The pool is a
// caller's array (attn::PagePool, either layout) or attn's own KVCache, whose blocks live
// in slabs; the kernel sees no difference, so there is one paged path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "attn/kv_cache.hpp"

namespace attn::cache {

// Whether elements are stored as codes (int8, int4, fp8), which hold only finite values;
// whether their rows have scales (int8, int4); bytes of one stored element (int4: 1, two
// codes, see row_bytes); bytes of a row of dim elements; the dtype of the stored rows
// (codes: of their float32 values).
bool holds_codes(CacheDType dtype);
bool has_scales(CacheDType dtype);
Index row_bytes(CacheDType dtype, Index dim);
// Throws attn::Error naming prefix + the dim's name unless each dim is a multiple of 32, for
// int4 (its nibbles go in blocks of 32).
void check_int4_dims(const std::string& prefix, CacheDType dtype,
                     std::initializer_list<std::pair<const char*, Index>> dims);
// Throws attn::Error naming `name` unless group is 0, or for int8 and int4 one of 32, 64 and
// 128 dividing each of dims.
void check_group(const std::string& name, CacheDType dtype, Index group,
                 std::initializer_list<Index> dims);
// Throws attn::Error naming `name` for zero_point with a dtype other than int8 and int4.
void check_zero_point(const std::string& name, CacheDType dtype, bool zero_point);
// The value of a code of group g of a row whose scales start at row_scales, as the kernels
// read it: code * scale, or with zero_point code * scale + offset, rounded once.
float code_value(int code, const float* row_scales, Index g, bool zero_point);
// Throws attn::Error naming `name` unless each of the heads' fp8 scales is positive and
// finite.
void check_head_scales(const std::string& name, const float* scales, Index heads);
bool is_fp8(CacheDType dtype);
// An fp8 pool's codes of n elements: from float64 values (finite), and back as float32.
void fp8_narrow(CacheDType dtype, const double* row, Index n, std::uint8_t* codes);
void fp8_widen(CacheDType dtype, const std::uint8_t* codes, Index n, float* row);
std::size_t element_bytes(CacheDType dtype);
DType storage_dtype(CacheDType dtype);

struct PageRows {
  CacheDType dtype = CacheDType::f32;
  Index page_size = 0, heads_kv = 0, dim = 0;
  // attn's own cache (its keys, or its values), or else the caller's pool below.
  const KVCache* cache = nullptr;
  bool values = false;
  std::byte* data = nullptr;
  // int8 and int4: one per (page, KV head, slot), laid out as the rows, or with group > 0
  // one per group of `group` elements of each row, the row's groups one after another. fp8
  // (optional: a caller's pool's, or a KVCache's k_scale or v_scale): one per KV head
  // (head_scales 1, the other strides 0).
  // zero_point: each a (scale, offset) pair.
  float* scales = nullptr;
  Index group = 0;
  bool zero_point = false;
  // In bytes: from one page, KV head and slot to the next.
  Index page_bytes = 0, head_bytes = 0, slot_bytes = 0;
  // In scales: from one page, KV head and slot to the next (a KVCache's: slot_scales only).
  Index page_scales = 0, head_scales = 0, slot_scales = 0;

  std::byte* rows(std::int32_t page, Index head) const;
  // The dequantisation scale of a slot's row of the page's KV head (int8 and int4; grouped:
  // of the row's first group, the others following it; fp8 with head scales: the head's).
  float& scale_ref(std::int32_t page, Index head, Index slot) const;
  // int8, int4 and head-scaled fp8: the scales of slot 0 of the page's KV head, slot s's
  // slot_scales later (found once per page, as rows is, by the kernel's walk over keys).
  const float* scale_row(std::int32_t page, Index head) const { return &scale_ref(page, head, 0); }
  // Scales per row: its groups, or 1; and floats of them (twice as many with zero_point).
  Index groups() const { return group > 0 ? dim / group : 1; }
  Index row_scales() const { return zero_point ? 2 * groups() : groups(); }
  // An fp8 pool with a scale per KV head.
  bool head_scaled() const { return is_fp8(dtype) && scales != nullptr; }
  // A slot's rows of every KV head lie side by side (token-major pools), so one KV head's
  // rows of a page are apart.
  bool slots_interleave_heads() const { return slot_bytes > head_bytes; }
};

// The keys (values = false) or values of a KVCache as page rows.
PageRows page_rows_of(const KVCache& cache, bool values);

}  // namespace attn::cache
