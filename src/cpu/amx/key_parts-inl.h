// fp16 K as its exact bf16 parts (cpu/amx/fp16_parts.hpp), split once per forward or weights
// call for their AMX scores: written against Highway and compiled per target (include this
// header after foreach_target.h).
#if defined(ATTN_CPU_KEY_PARTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_KEY_PARTS_INL_H_
#undef ATTN_CPU_KEY_PARTS_INL_H_
#else
#define ATTN_CPU_KEY_PARTS_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attn/half.hpp"
#include "core/problem.hpp"
#include "cpu/amx/fp16_parts.hpp"
#include "cpu/plan/plan.hpp"

#include "cpu/tile/run-inl.h"
#include "cpu/tile/target-inl.h"
#include "cpu/tile/to_floats-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

// [B][Hkv][total_k][2 dim] bf16 parts (put_key_parts) and [B][Hkv][total_k] whether each key
// is finite. Splitting a tile per work item instead would widen each key once per item, as
// often as the scores on tiles read it. Empty unless the plan scores some wide chunk on fp16
// parts (Plan::splits_keys): narrow chunks score by dot products from K itself.
struct KeyParts {
  static constexpr Index kKeysPerItem = 256;

  KeyParts(const core::Problem& p, const Plan& plan, int threads)
      : keys(plan.splits_keys() ? p.batch * p.heads_kv * p.total_k : 0),
        dim(p.dim_qk),
        heads_kv(p.heads_kv),
        total_k(p.total_k),
        pairs(tile::scratch_buffer<std::uint16_t>(keys * 2 * dim)),
        finite(tile::scratch_buffer<std::uint8_t>(keys)) {
    if (keys == 0) return;
    const Index blocks = (keys + kKeysPerItem - 1) / kKeysPerItem;
    tile::run_items(blocks, tile::threads_for(blocks, threads), [&](int) {
      return [&, row = std::vector<float>(static_cast<std::size_t>(dim))](Index block) mutable {
        for (Index key = block * kKeysPerItem; key < std::min(keys, (block + 1) * kKeysPerItem);
             ++key) {
          const Index b = key / (p.heads_kv * p.total_k), kv = key / p.total_k % p.heads_kv;
          to_floats(core::row_of<float16>(p.k, b, kv, key % p.total_k), dim, row.data());
          finite[key] = put_key_parts(row.data(), dim, pairs.get() + key * 2 * dim);
        }
      };
    });
  }

  // Key j of batch b and KV head kv: its 2 dim parts, and its finite flag.
  const std::uint16_t* parts_of(Index b, Index kv, Index j) const {
    return pairs.get() + ((b * heads_kv + kv) * total_k + j) * 2 * dim;
  }
  const std::uint8_t* finite_of(Index b, Index kv, Index j) const {
    return finite.get() + (b * heads_kv + kv) * total_k + j;
  }

  Index keys, dim, heads_kv, total_k;
  hwy::AlignedFreeUniquePtr<std::uint16_t[]> pairs;
  hwy::AlignedFreeUniquePtr<std::uint8_t[]> finite;
};

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_KEY_PARTS_INL_H_
