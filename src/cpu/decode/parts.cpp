#include "cpu/decode/parts.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "cpu/decode/traits.hpp"

namespace attn::cpu {
namespace {

using Traits = DecodeTraits;

// Parts over keys [begin, end) for the queries of `members`, cut at multiples of kSplitKeys.
void add_parts(DecodeParts& plan, std::vector<Member> members, Index group, Index begin,
               Index end) {
  Index rows = 0;
  for (Member& m : members) {
    m.row_offset = rows;
    rows += group * (m.query_end - m.query_begin);
  }
  while (begin < end) {
    const Index split_end = std::min(end, (begin / Traits::kSplitKeys + 1) * Traits::kSplitKeys);
    plan.parts.push_back({members, begin, split_end, rows});
    begin = split_end;
  }
}

// Keys [first, end) that some query of [query_begin, query_end) of sequence s sees.
std::pair<Index, Index> visible_span(const DecodeProblem& p, Index s, Index query_begin,
                                     Index query_end) {
  Index first = std::numeric_limits<Index>::max(), end = 0;
  for (Index i = query_begin; i < query_end; ++i) {
    const core::KeyRange keys = p.rule.visible_keys(p.query_position(s, i), p.lengths[s]);
    if (keys.first >= keys.end) continue;
    first = std::min(first, keys.first);
    end = std::max(end, keys.end);
  }
  return first < end ? std::pair{first, end} : std::pair<Index, Index>{0, 0};
}

}  // namespace

DecodeParts make_parts(const DecodeProblem& p, int threads) {
  const Index page = p.page_size(), group = p.group_size();
  // Sequences with few queries share a prompt prefix; a long query run is compute-bound and
  // goes in runs of its own.
  // (first page, sequence), sorted: the candidates for sharing, grouped by first page.
  std::vector<std::pair<std::int32_t, Index>> by_first_page;
  for (Index s = 0; s < p.sequences(); ++s) {
    const Index n_q = p.queries(s);
    if (n_q > 0 && n_q <= Traits::kSplitQueries && p.lengths[s] >= Traits::kSplitKeys)
      by_first_page.emplace_back(p.tables[s][0], s);
  }
  std::sort(by_first_page.begin(), by_first_page.end());
  DecodeParts plan;
  std::vector<Index> prefix(static_cast<std::size_t>(p.sequences()), 0);
  for (auto group_begin = by_first_page.begin(); group_begin != by_first_page.end();) {
    auto group_end = group_begin;
    std::vector<Index> members;
    for (; group_end != by_first_page.end() && group_end->first == group_begin->first; ++group_end)
      members.push_back(group_end->second);
    group_begin = group_end;
    if (members.size() < 2) continue;
    Index pages = std::numeric_limits<Index>::max();
    for (const Index s : members) pages = std::min(pages, p.lengths[s] / page);
    const auto& lead = p.tables[members[0]];
    for (const Index s : members) {
      const auto& table = p.tables[s];
      Index agree = 0;
      while (agree < pages && table[agree] == lead[agree]) ++agree;
      pages = agree;
    }
    const Index shared = pages * page / Traits::kSplitKeys * Traits::kSplitKeys;
    if (shared == 0) continue;
    std::vector<Member> group_members;
    for (const Index s : members) {
      group_members.push_back({s, 0, p.queries(s), 0});
      prefix[s] = shared;
    }
    add_parts(plan, group_members, group, 0, shared);
  }
  // Long query runs (a prefill chunk) whose parts no other sequence shares: as tasks of
  // their own they would keep every part's states in partial rows (64 MiB for a 512-query
  // chunk over 4096 keys at Hq 32, d 128) and merge them on one thread after the rest.
  std::vector<Task> long_runs;
  for (Index s = 0; s < p.sequences(); ++s) {
    const Index n_q = p.queries(s);
    for (Index q0 = 0; q0 < n_q; q0 += Traits::kSplitQueries) {
      const Index q1 = std::min(n_q, q0 + Traits::kSplitQueries);
      // Keys no query of the run sees are not a part of it (an empty state merges as none).
      const auto [first, end] = visible_span(p, s, q0, q1);
      const Index begin = std::max(prefix[s], first / Traits::kSplitKeys * Traits::kSplitKeys);
      const auto run_first = static_cast<Index>(plan.parts.size());
      add_parts(plan, {{s, q0, q1, 0}}, group, begin, end);
      const auto run_end = static_cast<Index>(plan.parts.size());
      if (prefix[s] == 0 && q1 - q0 >= Traits::kMergedRunQueries && run_end > run_first) {
        long_runs.push_back({run_first, run_end, true});
      }
    }
  }
  // Merged tasks only where there are enough to share among the threads: else a lone long
  // run keeps its parts as tasks, for every thread to take some.
  if (static_cast<Index>(long_runs.size()) < Traits::kMergedRunsPerThread * threads) {
    long_runs.clear();
  }
  std::vector<bool> merged(plan.parts.size(), false);
  plan.tasks = long_runs;
  for (const Task& task : long_runs) {
    std::fill(merged.begin() + task.first, merged.begin() + task.end, true);
  }
  for (Index i = 0; i < static_cast<Index>(plan.parts.size()); ++i) {
    if (!merged[static_cast<std::size_t>(i)]) plan.tasks.push_back({i, i + 1, false});
  }

  for (std::size_t i = 0; i < plan.parts.size(); ++i) {
    const Part& part = plan.parts[i];
    plan.state_offset.push_back(merged[i] ? -1 : plan.total_rows);
    if (!merged[i]) plan.total_rows += part.rows * p.heads_kv;
    plan.max_rows = std::max(plan.max_rows, part.rows * p.heads_kv);
  }
  return plan;
}

Index tile_keys(Index page) {
  const Index keys = page >= Traits::kMinTileKeys ? std::min<Index>(page, Traits::kKeyTile)
                                                  : (Traits::kMinTileKeys + page - 1) / page * page;
  return static_cast<Index>(std::bit_ceil(static_cast<std::uint64_t>(keys)));
}

}  // namespace attn::cpu
