// Where each rank's rows sit in the global sequence, and which key shards each query shard
// sees (by the one visibility rule, core/visible_keys.hpp).
#pragma once

#include <vector>

#include "attn/dist.hpp"
#include "attn/options.hpp"

namespace attn::dist {

// A run of `count` consecutive global rows starting at global row `global`, held at local
// row `local` of its rank.
struct Piece {
  Index global = 0, count = 0, local = 0;
};

// Each of `ranks` ranks' row count when a sequence of `length` rows is split: contiguous, as
// evenly as can be (the first length % ranks ranks hold one row more); zigzag, length /
// ranks each (the caller checked that 2 * ranks divides length).
std::vector<Index> split_rows(Sharding sharding, Index length, int ranks);

// rows: [N] each rank's local row count. contiguous: one piece per rank; zigzag: two, the
// chunks r and 2N - 1 - r (the caller checked that the counts are even and equal).
std::vector<std::vector<Piece>> pieces(Sharding sharding, const std::vector<Index>& rows);

// The position offset that places query piece q among the keys of key piece k, given that
// global query row i sits at global key position i + shift (the alignment and the caller's
// own position_offset): for a top-left call on the two pieces' rows.
inline Index offset_between(const Piece& q, const Piece& k, Index shift) {
  return q.global + shift - k.global;
}

// Does any query row of q see any key of k? (causal and window; ALiBi and softcap hide
// nothing.)
bool sees(const Options& options, const Piece& q, const Piece& k, Index shift);

// needs[s][r]: does rank r see any key that rank s holds?
std::vector<std::vector<bool>> needs(const Options& options,
                                     const std::vector<std::vector<Piece>>& q_pieces,
                                     const std::vector<std::vector<Piece>>& k_pieces, Index shift);

}  // namespace attn::dist
