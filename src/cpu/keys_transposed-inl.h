// K as float32, transposed once per weights call (the packing of src/cpu/weights.cpp):
// written against Highway and compiled per target (include this header after
// foreach_target.h).
#if defined(ATTN_CPU_KEYS_TRANSPOSED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_KEYS_TRANSPOSED_INL_H_
#undef ATTN_CPU_KEYS_TRANSPOSED_INL_H_
#else
#define ATTN_CPU_KEYS_TRANSPOSED_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/element_type.hpp"
#include "core/problem.hpp"
#include "cpu/weights_traits.hpp"

#include "cpu/tile/run-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

// K as f32, transposed once for every work item: [B][Hkv][dim][stride], stride = total_k
// plus a tile of padding, so that a tile's last vector may read past the last key. Packing
// each tile per work item instead cost 20% of the top-k pass (scalar transposes). Empty
// unless `wanted` (a pass that reads K's rows in place needs none).
struct KeysTransposed {
  static constexpr Index kTile = WeightsTraits::kKeyTile;

  KeysTransposed(const core::Problem& p, int threads, bool wanted)
      : stride(wanted ? core::round_up(p.total_k, 16) + kTile : 0),
        data(tile::scratch_buffer<float>(p.batch * p.heads_kv * p.dim_qk * stride)) {
    if (!wanted) return;
    const Index dim = p.dim_qk, blocks = (p.total_k + kTile - 1) / kTile;
    const auto pack = [&](Index item, std::vector<float>& row) {
      const Index b = item / (p.heads_kv * blocks), kv = item / blocks % p.heads_kv;
      const Index first = item % blocks * kTile, end = std::min(first + kTile, p.total_k);
      float* out = at(b, kv, p.heads_kv, dim);
      core::with_float_type(p.k.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, double>) {
          for (Index j = first; j < end; ++j) {
            to_floats(core::row_of<T>(p.k, b, kv, j), dim, row.data());
            for (Index d = 0; d < dim; ++d) out[d * stride + j] = row[static_cast<std::size_t>(d)];
          }
        }
      });
    };
    tile::run_items(p.batch * p.heads_kv * blocks, threads, [&](int) {
      return [&, row = std::vector<float>(static_cast<std::size_t>(dim))](Index item) mutable {
        pack(item, row);
      };
    });
    for (Index plane = 0; plane < p.batch * p.heads_kv * dim; ++plane) {
      std::fill(data.get() + plane * stride + p.total_k, data.get() + (plane + 1) * stride, 0.0f);
    }
  }

  float* at(Index b, Index kv, Index heads_kv, Index dim) const {
    return data.get() + (b * heads_kv + kv) * dim * stride;
  }

  Index stride;
  hwy::AlignedFreeUniquePtr<float[]> data;
};

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_KEYS_TRANSPOSED_INL_H_
