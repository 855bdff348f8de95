// How a decode step is cut into tasks: the parts of each sequence's keys (a shared
// prompt prefix read once for every sequence of a fork group, then each sequence's own keys
// cut at multiples of DecodeTraits::kSplitKeys), and where each part's partial states go.
// Plain planning, no SIMD: the kernel (decode.cpp) walks the parts.
#pragma once

#include <vector>

#include "cpu/decode/decode.hpp"

namespace attn::cpu {

// A run of keys [key_begin, key_end) read for the queries of `members` (indices into the
// problem's sequences), whose block tables agree on these keys.
struct Part {
  std::vector<Index> members;
  Index key_begin = 0, key_end = 0;
};

struct DecodeParts {
  std::vector<Part> parts;
  std::vector<Index> state_offset;           // [parts]: first partial-state row of (part, head 0)
  std::vector<std::vector<Index>> parts_of;  // [S]: the parts holding a sequence's keys, in order
  std::vector<std::vector<Index>> member_index;  // [S]: its position among each part's members
  Index total_rows = 0;                          // partial states over all (part, head)
  Index max_rows = 0;                            // rows of the largest task, all KV heads
};

// Groups sequences by their first block; a group of two or more shares the leading full
// blocks that all of its tables hold.
DecodeParts make_parts(const DecodeProblem& p);

// Keys per tile for a page size: one block, or cut to kKeyTile, or whole blocks up to
// kMinTileKeys (see DecodeTraits).
Index tile_keys(Index page);

}  // namespace attn::cpu
