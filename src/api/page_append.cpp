// attn::append_pages: new tokens written into the caller's pools at their slots, every
// argument checked (naming it) before the first byte is written.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "api/page_pools.hpp"
#include "attn/paged.hpp"
#include "cache/page_writes.hpp"
#include "core/argument_checks.hpp"
#include "core/rotary.hpp"

namespace attn {
namespace {

using core::fail;

void check_tokens(const char* name, const TensorView& t, Index tokens, const PagePool& pool) {
  core::check_float_dtype(name, t.dtype);
  if (t.shape[0] != 1 || t.shape[1] != tokens || t.shape[2] != pool.heads_kv ||
      t.shape[3] != pool.dim) {
    fail(name,
         "shape [1, " + std::to_string(tokens) + " (one per slot), " +
             std::to_string(pool.heads_kv) + ", " + std::to_string(pool.dim) + "]",
         format_dims(t.shape));
  }
  core::check_storage(name, t);
}

// Each slot inside the pool, none twice.
void check_slots(std::span<const std::int64_t> slots, const PagePool& pool) {
  const Index capacity = pool.pages * pool.page_size;
  std::vector<Index> order;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] >= capacity) {
      fail("slots", "slots below pages * page_size = " + std::to_string(capacity),
           "slots[" + std::to_string(i) + "] = " + std::to_string(slots[i]));
    }
    if (slots[i] >= 0) order.push_back(static_cast<Index>(i));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](Index a, Index b) { return slots[a] < slots[b]; });
  for (std::size_t j = 1; j < order.size(); ++j) {
    if (slots[order[j]] == slots[order[j - 1]]) {
      fail("slots", "each slot at most once",
           "slot " + std::to_string(slots[order[j]]) + " for tokens " +
               std::to_string(order[j - 1]) + " and " + std::to_string(order[j]));
    }
  }
}

}  // namespace

void append_pages(const TensorView& k, const TensorView& v, std::span<const std::int64_t> slots,
                  const PagePool& keys, const PagePool& values, const Rotary& rotary) {
  api::check_pools(keys, values);
  const auto tokens = static_cast<Index>(slots.size());
  check_tokens("k", k, tokens, keys);
  check_tokens("v", v, tokens, values);
  check_slots(slots, keys);
  core::check_rotary("rotary", rotary, keys.dim, tokens, true);
  const bool rotate = rotary.style != RotaryStyle::none;
  const cache::NewRows new_keys{k, true, rotate ? &rotary : nullptr}, new_values{v, true, nullptr};
  cache::check_finite_for_codes("k", new_keys, keys.heads_kv, keys.dtype);
  cache::check_finite_for_codes("v", new_values, values.heads_kv, values.dtype);
  const cache::PageRows key_rows = api::rows_of(keys), value_rows = api::rows_of(values);
  const Index page = keys.page_size;
  // Runs of tokens bound for consecutive slots of one page go in one write.
  for (Index i = 0; i < tokens;) {
    if (slots[i] < 0) {
      ++i;
      continue;
    }
    Index end = i + 1;
    while (end < tokens && slots[end] == slots[end - 1] + 1 && slots[end] % page != 0) ++end;
    const auto page_index = static_cast<std::int32_t>(slots[i] / page);
    cache::write_run(key_rows, page_index, slots[i] % page, new_keys, i, end - i);
    cache::write_run(value_rows, page_index, slots[i] % page, new_values, i, end - i);
    i = end;
  }
}

}  // namespace attn
