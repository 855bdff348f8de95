#include "dist/shards.hpp"

#include "core/visible_keys.hpp"

namespace attn::dist {

std::vector<Index> split_rows(Sharding sharding, Index length, int ranks) {
  std::vector<Index> rows(static_cast<std::size_t>(ranks), length / ranks);
  if (sharding == Sharding::contiguous) {
    for (Index r = 0; r < length % ranks; ++r) ++rows[static_cast<std::size_t>(r)];
  }
  return rows;
}

std::vector<std::vector<Piece>> pieces(Sharding sharding, const std::vector<Index>& rows) {
  const auto ranks = static_cast<Index>(rows.size());
  std::vector<std::vector<Piece>> out(rows.size());
  Index global = 0;
  for (Index r = 0; r < ranks; ++r) {
    const Index count = rows[static_cast<std::size_t>(r)];
    if (sharding == Sharding::contiguous) {
      out[static_cast<std::size_t>(r)] = {{global, count, 0}};
      global += count;
    } else {
      const Index chunk = count / 2;
      out[static_cast<std::size_t>(r)] = {{r * chunk, chunk, 0},
                                          {(2 * ranks - 1 - r) * chunk, chunk, chunk}};
    }
  }
  return out;
}

bool sees(const Options& options, const Piece& q, const Piece& k, Index shift) {
  if (q.count == 0 || k.count == 0) return false;
  const Index offset = offset_between(q, k, shift);
  for (Index i = 0; i < q.count; ++i) {
    const core::KeyRange keys =
        core::visible_keys(options.causal, options.window, i + offset, k.count);
    if (keys.first < keys.end) return true;
  }
  return false;
}

std::vector<std::vector<bool>> needs(const Options& options,
                                     const std::vector<std::vector<Piece>>& q_pieces,
                                     const std::vector<std::vector<Piece>>& k_pieces, Index shift) {
  const std::size_t ranks = q_pieces.size();
  std::vector<std::vector<bool>> out(ranks, std::vector<bool>(ranks, false));
  for (std::size_t s = 0; s < ranks; ++s)
    for (std::size_t r = 0; r < ranks; ++r)
      for (const Piece& q : q_pieces[r])
        for (const Piece& k : k_pieces[s])
          if (!out[s][r] && sees(options, q, k, shift)) out[s][r] = true;
  return out;
}

}  // namespace attn::dist
