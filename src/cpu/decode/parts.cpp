#include "cpu/decode/parts.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>

#include "cpu/decode/traits.hpp"

namespace attn::cpu {
namespace {

using Traits = DecodeTraits;

void add_parts(DecodeParts& plan, const std::vector<Index>& members, Index begin, Index end) {
  while (begin < end) {
    const Index split_end = std::min(end, (begin / Traits::kSplitKeys + 1) * Traits::kSplitKeys);
    plan.parts.push_back({members, begin, split_end});
    begin = split_end;
  }
}

}  // namespace

DecodeParts make_parts(const DecodeProblem& p) {
  const Index page = p.cache->config().page_size;
  std::map<std::int32_t, std::vector<Index>> by_first_block;
  for (Index s = 0; s < p.sequences(); ++s) {
    if (p.lengths[s] >= page) by_first_block[(*p.tables[s])[0]].push_back(s);
  }
  DecodeParts plan;
  std::vector<Index> prefix(static_cast<std::size_t>(p.sequences()), 0);
  for (const auto& [first, members] : by_first_block) {
    if (members.size() < 2) continue;
    Index blocks = std::numeric_limits<Index>::max();
    for (const Index s : members) blocks = std::min(blocks, p.lengths[s] / page);
    const auto& lead = *p.tables[members[0]];
    for (const Index s : members) {
      const auto& table = *p.tables[s];
      Index agree = 0;
      while (agree < blocks && table[agree] == lead[agree]) ++agree;
      blocks = agree;
    }
    add_parts(plan, members, 0, blocks * page);
    for (const Index s : members) prefix[s] = blocks * page;
  }
  for (Index s = 0; s < p.sequences(); ++s) add_parts(plan, {s}, prefix[s], p.lengths[s]);

  plan.parts_of.resize(static_cast<std::size_t>(p.sequences()));
  plan.member_index.resize(static_cast<std::size_t>(p.sequences()));
  const Index rows_per_member = p.group_size() * p.queries;
  for (std::size_t i = 0; i < plan.parts.size(); ++i) {
    const Part& part = plan.parts[i];
    for (std::size_t m = 0; m < part.members.size(); ++m) {
      plan.parts_of[part.members[m]].push_back(static_cast<Index>(i));
      plan.member_index[part.members[m]].push_back(static_cast<Index>(m));
    }
    const Index rows = static_cast<Index>(part.members.size()) * rows_per_member;
    plan.state_offset.push_back(plan.total_rows);
    plan.total_rows += rows * p.heads_kv;
    plan.max_rows = std::max(plan.max_rows, rows * p.heads_kv);
  }
  return plan;
}

Index tile_keys(Index page) {
  if (page >= Traits::kMinTileKeys) return std::min<Index>(page, Traits::kKeyTile);
  return (Traits::kMinTileKeys + page - 1) / page * page;
}

}  // namespace attn::cpu
