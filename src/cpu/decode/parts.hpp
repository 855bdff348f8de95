// How a paged step is cut into tasks: the parts of each sequence's keys (a shared prompt
// prefix read once for every sequence of a fork group, then each sequence's own keys), all
// cut at multiples of DecodeTraits::kSplitKeys, and long query runs cut at multiples of
// DecodeTraits::kSplitQueries; and where each part's partial states go. Plain planning, no
// SIMD: the kernel (decode.cpp) walks the parts.
#pragma once

#include <vector>

#include "cpu/decode/decode.hpp"

namespace attn::cpu {

// Queries [query_begin, query_end) of sequence `seq`, whose rows in a part start at
// row_offset (rows of one KV head: the group's query heads, each over the queries).
struct Member {
  Index seq = 0, query_begin = 0, query_end = 0, row_offset = 0;
};

// A run of keys [key_begin, key_end) read for the queries of `members`, whose page tables
// agree on these keys.
struct Part {
  std::vector<Member> members;
  Index key_begin = 0, key_end = 0;
  Index rows = 0;  // of one KV head, over all members
};

// Parts [first, end), computed in key order by one task. merged: each part's states are
// merged into the step's state by the task as soon as it is computed (the parts of one long
// query run, which no other part holds), with no partial-state rows; else one part whose
// states wait in partial rows for the merge after every task.
struct Task {
  Index first = 0, end = 0;
  bool merged = false;
};

struct DecodeParts {
  std::vector<Part> parts;  // the parts holding any one query are in key order
  std::vector<Task> tasks;  // the long query runs' tasks first
  // [parts]: first partial-state row of (part, head 0); -1 for the parts of merged tasks.
  std::vector<Index> state_offset;
  Index total_rows = 0;  // partial states over the parts of unmerged tasks (all heads)
  Index max_rows = 0;    // rows of the largest part, all KV heads
};

// Groups sequences by their first page; a group of two or more shares the leading
// kSplitKeys-multiple of keys whose pages all of its tables hold. Long query runs become
// merged tasks where there are enough of them to keep `threads` busy; which parts a task
// holds changes who computes them, never their arithmetic or the merge order.
DecodeParts make_parts(const DecodeProblem& p, int threads);

// Keys per tile for a page size: one page, or cut to kKeyTile, or whole pages up to
// kMinTileKeys, rounded up to a power of two (so tiles hold whole softmax steps and parts
// whole tiles; see DecodeTraits).
Index tile_keys(Index page);

}  // namespace attn::cpu
