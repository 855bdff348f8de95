#include "cache/page_writes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/argument_checks.hpp"
#include "core/int4.hpp"
#include "core/rotary.hpp"
#include "core/rows.hpp"

namespace attn::cache {
namespace {

void load(const NewRows& in, Index i, Index h, double* row) {
  core::load_row(in.rows, 0, in.index1(i, h), in.index2(i, h), row);
  if (in.rotary != nullptr)
    core::rotate(*in.rotary, in.rows.shape[3], in.rotary->positions[i], row);
}

void set_code(CacheDType dtype, std::byte* codes, Index d, long code) {
  if (dtype == CacheDType::int4) {
    set_int4_code(reinterpret_cast<Int4Pair*>(codes), d, static_cast<int>(code));
  } else {
    reinterpret_cast<std::int8_t*>(codes)[d] = static_cast<std::int8_t>(code);
  }
}

// One row's codes and its groups' scales (and offsets). Symmetric: int8's scale max |x| /
// 127; int4's q4_0's m / -8, for m the element of largest magnitude (the first of equals),
// which so takes the code -8 exactly. zero_point: the group's [min, max] over every code
// (KVCacheConfig::zero_point), codes rounded against the offset as stored.
void quantise_row(const PageRows& pool, const double* row, float* scales, std::byte* codes) {
  const bool int4 = pool.dtype == CacheDType::int4;
  const long lowest = int4 ? -8 : -128 + !pool.zero_point, highest = int4 ? 7 : 127;
  const Index group = pool.group > 0 ? pool.group : pool.dim;
  for (Index g = 0; g < pool.dim / group; ++g) {
    const double* part = row + g * group;
    float scale = 0.0f, offset = 0.0f;
    if (pool.zero_point) {
      const auto [min, max] = std::minmax_element(part, part + group);
      scale = static_cast<float>((*max - *min) / static_cast<double>(highest - lowest));
      offset = static_cast<float>(*min - static_cast<double>(lowest) * scale);
      scales[2 * g] = scale;
      scales[2 * g + 1] = offset;
    } else {
      double largest = 0.0;
      for (Index d = 0; d < group; ++d) {
        if (std::abs(part[d]) > std::abs(largest)) largest = part[d];
      }
      scale = static_cast<float>(int4 ? largest / -8.0 : std::abs(largest) / 127.0);
      scales[g] = scale;
    }
    for (Index d = 0; d < group; ++d) {
      const double x = scale != 0.0f ? (part[d] - offset) / scale : 0.0;
      set_code(pool.dtype, codes, g * group + d, std::clamp<long>(std::lround(x), lowest, highest));
    }
  }
}

}  // namespace

void check_finite_for_codes(const char* name, const NewRows& in, Index heads_kv, CacheDType dtype) {
  if (!holds_codes(dtype)) return;
  std::vector<double> row(static_cast<std::size_t>(in.rows.shape[3]));
  for (Index h = 0; h < heads_kv; ++h)
    for (Index i = 0; i < in.tokens(); ++i) {
      load(in, i, h, row.data());
      for (const double x : row) {
        if (!std::isfinite(x)) {
          core::fail(
              name, std::string("finite values for ") + cache_dtype_name(dtype) + " pages",
              std::to_string(x) + " at head " + std::to_string(h) + ", token " + std::to_string(i));
        }
      }
    }
}

void write_run(const PageRows& pool, std::int32_t page, Index slot, const NewRows& in, Index first,
               Index count) {
  const Index dim = pool.dim;
  std::vector<double> row(static_cast<std::size_t>(dim));
  for (Index h = 0; h < pool.heads_kv; ++h) {
    std::byte* base = pool.rows(page, h);
    const auto at = [&](Index s) { return base + s * pool.slot_bytes; };
    if (is_fp8(pool.dtype)) {
      // With a head scale s, the code of x / s (vLLM's k_scale: x read back as code * s).
      const double scale = pool.head_scaled() ? pool.scale_ref(page, h, 0) : 1.0;
      for (Index i = 0; i < count; ++i) {
        load(in, first + i, h, row.data());
        for (double& x : row) x /= scale;
        fp8_narrow(pool.dtype, row.data(), dim, reinterpret_cast<std::uint8_t*>(at(slot + i)));
      }
      continue;
    }
    if (!has_scales(pool.dtype)) {
      const DType dtype = storage_dtype(pool.dtype);
      const MutableTensorView out(
          at(slot), dtype, {1, 1, count, dim},
          {0, 0, pool.slot_bytes / static_cast<Index>(dtype_size(dtype)), 1});
      for (Index i = 0; i < count; ++i) {
        if (in.rows.dtype == dtype && in.rotary == nullptr) {
          // Same dtype: the bits go in unchanged.
          const auto* from = static_cast<const std::byte*>(in.rows.data) +
                             (in.index1(first + i, h) * in.rows.strides[1] +
                              in.index2(first + i, h) * in.rows.strides[2]) *
                                 static_cast<Index>(dtype_size(dtype));
          std::memcpy(at(slot + i), from, static_cast<std::size_t>(dim) * dtype_size(dtype));
          continue;
        }
        load(in, first + i, h, row.data());
        core::store_row(out, 0, 0, i, row.data());
      }
      continue;
    }
    // int8 / int4: each token's row (or each group of it) quantised once, with its own
    // scale (and offset).
    for (Index i = 0; i < count; ++i) {
      load(in, first + i, h, row.data());
      quantise_row(pool, row.data(), &pool.scale_ref(page, h, slot + i), at(slot + i));
    }
  }
}

}  // namespace attn::cache
