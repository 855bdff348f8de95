// What a block mask (attn/block_mask.hpp) does to a row of scores, for every kernel that
// reads one: keys of empty blocks hidden, of partial blocks hidden where their bit is 0, of
// full blocks left as they are.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attn/block_mask.hpp"

namespace attn::core {

// scores[(j - first) * stride] = -inf for the keys j in [first, end) that the mask hides
// from query i of its batch entry `entry` and head `head`.
inline void hide_by_blocks(const BlockMask& mask, Index entry, Index head, Index i, Index first,
                           Index end, float* scores, Index stride) {
  const Index size = mask.block_size(), qb = i / size;
  for (Index kb = first / size; kb * size < end; ++kb) {
    const BlockMask::Block block = mask.block(entry, head, qb, kb);
    if (block == BlockMask::Block::full) continue;
    const Index from = std::max(first, kb * size), to = std::min(end, (kb + 1) * size);
    const std::uint64_t* bits =
        block == BlockMask::Block::partial ? mask.partial_row(entry, head, i, kb) : nullptr;
    for (Index j = from; j < to; ++j) {
      if (bits == nullptr || !BlockMask::row_shows(bits, j - kb * size)) {
        scores[(j - first) * stride] = -std::numeric_limits<float>::infinity();
      }
    }
  }
}

// Whether a block holding some of the keys [first, end) of query i is not empty.
inline bool blocks_show_any(const BlockMask& mask, Index entry, Index head, Index i, Index first,
                            Index end) {
  const Index size = mask.block_size(), qb = i / size;
  for (Index kb = first / size; kb * size < end; ++kb) {
    if (mask.block(entry, head, qb, kb) != BlockMask::Block::empty) return true;
  }
  return false;
}

}  // namespace attn::core
