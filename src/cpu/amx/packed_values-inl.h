// V^T in bf16 for forward's context on AMX tiles (cpu/amx/context.hpp), packed before the
// work items once per (segment, KV head): written against Highway and compiled per target
// (include this header after foreach_target.h).
#if defined(ATTN_CPU_AMX_PACKED_VALUES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_AMX_PACKED_VALUES_INL_H_
#undef ATTN_CPU_AMX_PACKED_VALUES_INL_H_
#else
#define ATTN_CPU_AMX_PACKED_VALUES_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attn/half.hpp"
#include "core/element_type.hpp"
#include "core/problem.hpp"
#include "cpu/amx/context.hpp"
#include "cpu/amx/fp16_parts.hpp"

#include "cpu/tile/run-inl.h"
#include "cpu/tile/to_floats-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {

// A slot per (segment, KV head): [parts][dim_v_padded][stride] with stride
// packed_values_stride of the segment's keys (cpu/amx/context.hpp), zeros past its keys and
// value dims, parts 1 for bf16 V and 2 for fp16 V (its exact bf16 parts,
// cpu/amx/fp16_parts.hpp); and per key block whether its values are all finite (a block that
// is not goes key by key, so that a weight of 0 never meets a NaN).
struct PackedValues {
  struct Slot {
    Index offset = 0, stride = 0, first_block = 0, plane = 0;  // plane: one part's size
  };

  PackedValues(const core::Problem& p, int threads) : parts(p.v.dtype == DType::f16 ? 2 : 1) {
    const Index dim_v_padded = core::round_up(p.dim_v, kAmxRows);
    Index total = 0, blocks = 0;
    for (const core::Segment& segment : p.segments) {
      const Index stride = packed_values_stride(segment.len_k);
      for (Index h = 0; h < p.heads_kv; ++h) {
        slots.push_back({total, stride, blocks, dim_v_padded * stride});
        total += parts * dim_v_padded * stride;
        blocks += core::round_up(segment.len_k, kAmxKeyBlock) / kAmxKeyBlock;
      }
    }
    values_t = tile::scratch_buffer<bfloat16>(total);
    finite.assign(static_cast<std::size_t>(blocks), 1);
    const auto count = static_cast<Index>(slots.size());
    tile::run_items(count, tile::threads_for(count, threads),
                    [&](int) { return [&](Index slot) { pack(p, slot); }; });
  }

  // Whether the values of keys [first_key, end_key) are all finite, by their whole key blocks.
  bool finite_over(Index slot, Index first_key, Index end_key) const {
    const Slot& at = slots[static_cast<std::size_t>(slot)];
    const Index end_block = core::round_up(end_key, kAmxKeyBlock) / kAmxKeyBlock;
    for (Index b = first_key / kAmxKeyBlock; b < end_block; ++b) {
      if (!finite[static_cast<std::size_t>(at.first_block + b)]) return false;
    }
    return true;
  }

  int parts;
  std::vector<Slot> slots;
  hwy::AlignedFreeUniquePtr<bfloat16[]> values_t;
  std::vector<unsigned char> finite;

 private:
  void pack(const core::Problem& p, Index slot) {
    const core::Segment& segment = p.segments[static_cast<std::size_t>(slot / p.heads_kv)];
    const Slot& at = slots[static_cast<std::size_t>(slot)];
    bfloat16* out = values_t.get() + at.offset;
    std::fill(out, out + parts * at.plane, bfloat16{});
    const Index kv_head = slot % p.heads_kv;
    // fp16: a row's values, then its parts (high, low), before they are scattered into V^T.
    std::vector<float> row(parts == 2 ? static_cast<std::size_t>(p.dim_v) : 0);
    std::vector<std::uint16_t> halves(2 * row.size());
    for (Index k = 0; k < segment.len_k; ++k) {
      bool all_finite = true;
      bfloat16* column = out + k;
      if (parts == 2) {
        to_floats(core::row_of<float16>(p.v, segment.batch, kv_head, segment.k_begin + k), p.dim_v,
                  row.data());
        all_finite = put_parts<1>(row.data(), p.dim_v, halves.data(), halves.data() + p.dim_v);
        for (Index d = 0; d < p.dim_v; ++d) {
          column[d * at.stride] = bfloat16{halves[static_cast<std::size_t>(d)]};
          column[at.plane + d * at.stride] =
              bfloat16{halves[static_cast<std::size_t>(p.dim_v + d)]};
        }
      } else {
        const bfloat16* v =
            core::row_of<bfloat16>(p.v, segment.batch, kv_head, segment.k_begin + k);
        for (Index d = 0; d < p.dim_v; ++d) {
          column[d * at.stride] = v[d];
          all_finite &= (v[d].bits & 0x7F80u) != 0x7F80u;
        }
      }
      if (!all_finite) finite[static_cast<std::size_t>(at.first_block + k / kAmxKeyBlock)] = 0;
    }
  }
};

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
