// The decode kernel (flash-decoding over a paged cache). The keys of each sequence are
// cut into parts: a shared prompt prefix (blocks that every sequence of a fork group
// holds, read once for all their queries), then the sequence's own keys, each cut at
// multiples of DecodeTraits::kSplitKeys. A task is a part over every KV head; its rows are
// every query head for each new query of each member sequence, so each K/V row is loaded
// once per task. Within a task, keys go by tiles of one block (or a few small blocks),
// every KV head of a tile in turn, which is the order of the cache's memory. Per tile and
// KV head: scores for blocks of the head's rows (K converted to float32 in registers), the
// online softmax per row (DESIGN.md's merge, one tile at a time), then P V into the row's
// accumulator. Each task leaves one state per
// row; the states of a sequence's parts are merged in key order afterwards, so threads only
// change who computes a part, never what is merged in which order.
// Keys outside a row's causal/window range are not read for that row (scores set to
// -inf, value rows skipped), so NaN in them never reaches the output.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/decode.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>
#include <vector>

#include "core/element_type.hpp"
#include "core/visible_keys.hpp"
#include "cpu/decode.hpp"
#include "cpu/decode_traits.hpp"
#include "cpu/threads.hpp"

#include "cpu/vector_exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using Traits = DecodeTraits;

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// A run of keys [key_begin, key_end) read for the queries of `members` (indices into the
// problem's sequences), whose block tables agree on these keys.
struct Part {
  std::vector<Index> members;
  Index key_begin = 0, key_end = 0;
};

struct Plan {
  std::vector<Part> parts;
  std::vector<Index> state_offset;           // [parts]: first partial-state row of (part, head 0)
  std::vector<std::vector<Index>> parts_of;  // [S]: the parts holding a sequence's keys, in order
  std::vector<std::vector<Index>> member_index;  // [S]: its position among each part's members
  Index total_rows = 0;                          // partial states over all (part, head)
  Index max_rows = 0;                            // rows of the largest task, all KV heads
};

void add_parts(Plan& plan, const std::vector<Index>& members, Index begin, Index end) {
  while (begin < end) {
    const Index split_end = std::min(end, (begin / Traits::kSplitKeys + 1) * Traits::kSplitKeys);
    plan.parts.push_back({members, begin, split_end});
    begin = split_end;
  }
}

// Groups sequences by their first block; a group of two or more shares the leading full
// blocks that all of its tables hold.
Plan make_plan(const DecodeProblem& p) {
  const Index page = p.cache->config().page_size;
  std::map<std::int32_t, std::vector<Index>> by_first_block;
  for (Index s = 0; s < p.sequences(); ++s) {
    if (p.lengths[s] >= page) by_first_block[(*p.tables[s])[0]].push_back(s);
  }
  Plan plan;
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

// Keys per tile for a page size: one block, or cut to kKeyTile, or whole blocks up to
// kMinTileKeys (see DecodeTraits).
Index tile_keys(Index page) {
  if (page >= Traits::kMinTileKeys) return std::min<Index>(page, Traits::kKeyTile);
  return (Traits::kMinTileKeys + page - 1) / page * page;
}

// Locality hints of __builtin_prefetch: to L1 (what hwy::Prefetch issues), or to L2.
constexpr int kToL1 = 3, kToL2 = 1;

// Asks for every cache line of a row of `bytes` bytes. It and every function that only
// prefetches must be inlined (HWY_INLINE): GCC takes a function with no effect but
// prefetches as pure and deletes calls to it that stay out of line.
template <int kLocality>
HWY_INLINE void prefetch_row(const void* row, Index bytes) {
  constexpr Index kLine = 64;
  constexpr int kRead = 0;
  for (Index offset = 0; offset < bytes; offset += kLine) {
    __builtin_prefetch(static_cast<const char*>(row) + offset, kRead, kLocality);
  }
}

// One vector of lanes elements of a stored row, as float32.
template <class T>
HWY_INLINE VF load_row(DF df, const T* HWY_RESTRICT row) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, row);
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    const hn::Rebind<std::int32_t, DF> di;
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(hn::Rebind<std::int8_t, DF>(), row)));
  } else {
    using Hwy = std::conditional_t<std::is_same_v<T, float16>, hwy::float16_t, hwy::bfloat16_t>;
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<Hwy, DF>(), reinterpret_cast<const Hwy*>(row)));
  }
}

template <class T>
HWY_INLINE float load_one(const T* row, Index d) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return to_float(row[d]);
  } else {
    return static_cast<float>(row[d]);
  }
}

#if HWY_TARGET != HWY_SCALAR
// out4[0 .. 4) = the sums over the 128-bit blocks of a 4-lane-per-block vector.
template <class D>
HWY_INLINE void store_block_sums(D d, hn::Vec<D> v, float* out4) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    store_block_sums(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out4);
  } else {
    hn::StoreU(v, d, out4);
  }
}
#endif

// out4 = the lane sums of a, b, c and e. Four reductions share one shuffle tree
// (interleave pairs, then 64-bit halves, then 128-bit blocks): about a quarter of the
// instructions of four separate SumOfLanes.
HWY_INLINE void sums_of_lanes4(DF df, VF a, VF b, VF c, VF e, float* out4) {
#if HWY_TARGET == HWY_SCALAR
  out4[0] = hn::GetLane(a), out4[1] = hn::GetLane(b), out4[2] = hn::GetLane(c);
  out4[3] = hn::GetLane(e);
  (void)df;
#else
  const VF ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));
  const VF ce = hn::Add(hn::InterleaveLower(df, c, e), hn::InterleaveUpper(df, c, e));
  const hn::Repartition<std::uint64_t, DF> du;
  const auto ab64 = hn::BitCast(du, ab), ce64 = hn::BitCast(du, ce);
  const VF low = hn::BitCast(df, hn::InterleaveLower(du, ab64, ce64));
  const VF high = hn::BitCast(df, hn::InterleaveUpper(du, ab64, ce64));
  store_block_sums(df, hn::Add(low, high), out4);
#endif
}

// scores[r][k] = q[r] . key[k] for NR rows and KK keys (dot products over dim).
// q: NR rows of [dim] float  keys: KK rows of [dim] T  scores: NR rows of KK floats
template <class T, int NR, int KK>
HWY_INLINE void score_block(const float* const* q, const T* const* keys, Index dim,
                            float* const* scores) {
  const DF df;
  const Index lanes = static_cast<Index>(hn::Lanes(df));
  VF acc[NR][KK];
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < KK; ++k) acc[r][k] = hn::Zero(df);
  const Index whole = dim - dim % lanes;
  for (Index d = 0; d < whole; d += lanes) {
    VF key[KK];
    for (int k = 0; k < KK; ++k) key[k] = load_row(df, keys[k] + d);
    for (int r = 0; r < NR; ++r) {
      const VF qv = hn::LoadU(df, q[r] + d);
      for (int k = 0; k < KK; ++k) acc[r][k] = hn::MulAdd(qv, key[k], acc[r][k]);
    }
  }
  // Lane sums of four keys of a row at a time, through one shuffle tree, straight into the
  // row's scores.
  for (int r = 0; r < NR; ++r) {
    int k = 0;
    for (; k + 4 <= KK; k += 4) {
      sums_of_lanes4(df, acc[r][k], acc[r][k + 1], acc[r][k + 2], acc[r][k + 3], scores[r] + k);
    }
    for (; k < KK; ++k) scores[r][k] = hn::GetLane(hn::SumOfLanes(df, acc[r][k]));
  }
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < KK; ++k)
      for (Index d = whole; d < dim; ++d) scores[r][k] += q[r][d] * load_one(keys[k], d);
}

// acc[r] += sum_{t in [first, end)} p[r][t] values[t] for NR rows. The value dim goes in
// chunks of W vectors held in NR * W registers across all keys, so a chunk of a value row
// is read once: at most 16 accumulators, so a row of 128 floats goes in one chunk for up to
// two rows, in two for three or four.
template <class T, int NR>
HWY_INLINE void accumulate_rows(float* const* acc, const float* const* p, const T* const* values,
                                Index first, Index end, Index dim_v) {
  constexpr int W = NR <= 2 ? 8 : 4;
  const DF df;
  const Index lanes = static_cast<Index>(hn::Lanes(df));
  const Index whole = dim_v - dim_v % lanes;
  Index c = 0;
  for (; c + W * lanes <= whole; c += W * lanes) {
    VF a[NR][W];
    for (int r = 0; r < NR; ++r)
      for (int w = 0; w < W; ++w) a[r][w] = hn::LoadU(df, acc[r] + c + w * lanes);
    for (Index t = first; t < end; ++t) {
      VF v[W];
      for (int w = 0; w < W; ++w) v[w] = load_row(df, values[t] + c + w * lanes);
      for (int r = 0; r < NR; ++r) {
        const VF weight = hn::Set(df, p[r][t]);
        for (int w = 0; w < W; ++w) a[r][w] = hn::MulAdd(weight, v[w], a[r][w]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int w = 0; w < W; ++w) hn::StoreU(a[r][w], df, acc[r] + c + w * lanes);
  }
  for (; c < whole; c += lanes) {
    VF a[NR];
    for (int r = 0; r < NR; ++r) a[r] = hn::LoadU(df, acc[r] + c);
    for (Index t = first; t < end; ++t) {
      const VF v = load_row(df, values[t] + c);
      for (int r = 0; r < NR; ++r) a[r] = hn::MulAdd(hn::Set(df, p[r][t]), v, a[r]);
    }
    for (int r = 0; r < NR; ++r) hn::StoreU(a[r], df, acc[r] + c);
  }
  for (Index d = whole; d < dim_v; ++d)
    for (Index t = first; t < end; ++t)
      for (int r = 0; r < NR; ++r) acc[r][d] += p[r][t] * load_one(values[t], d);
}

// Per-thread scratch, sized for the largest task; 64-byte aligned.
struct Scratch {
  static hwy::AlignedFreeUniquePtr<float[]> floats(Index count) {
    return hwy::AllocateAligned<float>(static_cast<std::size_t>(std::max<Index>(count, 1)));
  }
  Scratch(Index rows, Index dim, Index dim_v)
      : queries(floats(rows * dim)),
        scores(floats(rows * Traits::kKeyTile)),
        acc(floats(rows * dim_v)),
        row_max(static_cast<std::size_t>(rows)),
        row_sum(static_cast<std::size_t>(rows)),
        slope(static_cast<std::size_t>(rows)),
        first_key(static_cast<std::size_t>(rows)),
        end_key(static_cast<std::size_t>(rows)),
        position(static_cast<std::size_t>(rows)) {}

  hwy::AlignedFreeUniquePtr<float[]> queries;  // [rows][dim]: scale * q
  hwy::AlignedFreeUniquePtr<float[]> scores;   // [rows][kKeyTile]: scores, then weights
  hwy::AlignedFreeUniquePtr<float[]> acc;      // [rows][dim_v]: unnormalised context
  std::vector<float> row_max, row_sum, slope;
  std::vector<Index> first_key, end_key, position;  // each row's visible keys and position
};

// Where the keys [t0, t1) of one KV head lie: a row pointer (and int8 scale) per key.
template <class T>
struct TileRows {
  Index kv_head = 0, t0 = 0, t1 = 0;
  const T* keys[Traits::kKeyTile];
  const T* values[Traits::kKeyTile];
  float key_scale[Traits::kKeyTile], value_scale[Traits::kKeyTile];

  Index count() const { return t1 - t0; }
};

template <class T>
class TaskKernel {
 public:
  TaskKernel(const DecodeProblem& p, const Plan& plan, Scratch& s, State& partial)
      : p_(p), plan_(plan), s_(s), partial_(partial) {}

  void run(Index part_index) {
    const Part& part = plan_.parts[static_cast<std::size_t>(part_index)];
    const Index group = p_.group_size(), n_q = p_.queries;
    const Index rows = static_cast<Index>(part.members.size()) * group * n_q;
    Index union_first = part.key_end, union_end = part.key_begin;
    for (Index kv_head = 0; kv_head < p_.heads_kv; ++kv_head) {
      for (Index local = 0; local < rows; ++local) {
        const Index r = kv_head * rows + local;
        const Index seq = part.members[static_cast<std::size_t>(local / (group * n_q))];
        const Index head = kv_head * group + local / n_q % group, i = local % n_q;
        prepare_row(r, seq, head, i, part);
        union_first = std::min(union_first, s_.first_key[r]);
        union_end = std::max(union_end, s_.end_key[r]);
      }
    }
    // Memory order: a block holds every KV head's rows one after another, so walking heads
    // inside a tile of one block reads the pools front to back, where the hardware
    // prefetchers keep up; head by head over many blocks jumps every few KiB and reads at
    // less than half the bandwidth. The rows of each tile are found two tiles ahead, so
    // the tile being computed can ask for the two after it (see Lookahead).
    const Index step = tile_keys(p_.cache->config().page_size);
    const auto tile_end = [&](Index t0) { return std::min(union_end, (t0 / step + 1) * step); };
    const auto& table = *p_.tables[static_cast<std::size_t>(part.members[0])];
    // The tile after `from`: the next KV head of its keys, or the first head of the next
    // keys; empty after the last.
    const auto follow = [&](const TileRows<T>& from, TileRows<T>& to) {
      const Index kv_head = (from.kv_head + 1) % p_.heads_kv;
      const Index t0 = kv_head == 0 ? from.t1 : from.t0;
      to.t0 = to.t1 = t0;
      if (from.count() > 0 && t0 < union_end) find_rows(table, kv_head, t0, tile_end(t0), to);
    };
    // Tile i is at tiles[i % 3].
    std::array<TileRows<T>, 3> tiles;
    if (union_first < union_end) find_rows(table, 0, union_first, tile_end(union_first), tiles[0]);
    follow(tiles[0], tiles[1]);
    for (std::size_t i = 0; tiles[i].count() > 0; i = (i + 1) % tiles.size()) {
      const TileRows<T>& next = tiles[(i + 1) % tiles.size()];
      TileRows<T>& after_next = tiles[(i + 2) % tiles.size()];
      follow(next, after_next);
      tile(tiles[i], {next, after_next}, tiles[i].kv_head * rows, (tiles[i].kv_head + 1) * rows);
    }
    const Index all_rows = p_.heads_kv * rows;
    const Index offset = plan_.state_offset[static_cast<std::size_t>(part_index)];
    std::copy_n(s_.row_max.begin(), all_rows, partial_.m.data_as<float>() + offset);
    std::copy_n(s_.row_sum.begin(), all_rows, partial_.l.data_as<float>() + offset);
    std::copy_n(s_.acc.get(), all_rows * p_.dim_v,
                partial_.acc.data_as<float>() + offset * p_.dim_v);
  }

 private:
  void prepare_row(Index r, Index seq, Index head, Index i, const Part& part) {
    const Index length = p_.lengths[static_cast<std::size_t>(seq)];
    const Index position = length - p_.queries + i;
    const core::KeyRange keys = core::visible_keys(p_.causal, p_.window, position, length);
    s_.first_key[r] = std::max(keys.first, part.key_begin);
    s_.end_key[r] = std::min(keys.end, part.key_end);
    s_.position[r] = position;
    s_.slope[r] = p_.alibi_slopes.empty() ? 0.0f : p_.alibi_slopes[static_cast<std::size_t>(head)];
    s_.row_max[r] = kMinusInfinity;
    s_.row_sum[r] = 0.0f;
    std::fill_n(s_.acc.get() + r * p_.dim_v, p_.dim_v, 0.0f);
    const TensorView& q = p_.q;
    float* out = s_.queries.get() + r * p_.dim;
    core::with_float_type(q.dtype, [&](auto tag) {
      const auto* row = core::row_of<decltype(tag)>(q, seq, head, i);
      for (Index d = 0; d < p_.dim; ++d) {
        out[d] = static_cast<float>(static_cast<double>(load_one(row, d)) * p_.scale);
      }
    });
  }

  // Asks for the tile's value rows to come to L1 while its keys are scored: they are read
  // after the softmax, a few columns of every row at a time, where the hardware prefetchers
  // lag. This made Hq = 32, Hkv = 8 decode 5-10% faster from memory.
  HWY_INLINE void prefetch_values_to_l1(const T* const* values, Index count) const {
    const Index bytes = p_.dim_v * static_cast<Index>(sizeof(T));
    for (Index t = 0; t < count; ++t) prefetch_row<kToL1>(values[t], bytes);
  }

  // Finds the rows of keys [t0, t1) of kv_head through the block table.
  void find_rows(const std::vector<std::int32_t>& table, Index kv_head, Index t0, Index t1,
                 TileRows<T>& rows) const {
    const KVCache& cache = *p_.cache;
    const Index page = cache.config().page_size;
    rows.kv_head = kv_head;
    rows.t0 = t0;
    rows.t1 = t1;
    for (Index t = t0; t < t1;) {
      const std::int32_t block = table[static_cast<std::size_t>(t / page)];
      const T* k = reinterpret_cast<const T*>(cache.key_block(block, kv_head));
      const T* v = reinterpret_cast<const T*>(cache.value_block(block, kv_head));
      const float ks = cache.key_scale(block, kv_head), vs = cache.value_scale(block, kv_head);
      for (Index slot = t % page; slot < page && t < t1; ++slot, ++t) {
        rows.keys[t - t0] = k + slot * p_.dim;
        rows.values[t - t0] = v + slot * p_.dim_v;
        rows.key_scale[t - t0] = ks;
        rows.value_scale[t - t0] = vs;
      }
    }
  }

  // The two tiles after the one being computed, in memory order.
  struct Lookahead {
    const TileRows<T>& next;
    const TileRows<T>& after_next;

    Index count() const { return std::max(next.count(), after_next.count()); }
  };

  // Asks for rows [begin, end) of the tiles ahead: the keys and values of the one after
  // next to come to L2, then the keys of the next one to L1. The scoring loop asks for as
  // many rows as keys it has scored, so the requests go out spread over the tile's work.
  // Figures: Hq = 8, one thread, ns per key and KV head, from memory (Lk = 32768 / 262144).
  // - Spread, not back to back before the tile: back to back, L2 requests for the next
  //   tile were slower than none at all (39 against 35; 27 spread).
  // - Against the next tile to L2 alone: 25.4 / 26.8 went to 23.4 / 24.5, so a tile's
  //   scoring reads its keys from L1; with the cache in the CPU caches (Lk = 512), 15.9
  //   went to 17.4. Either half alone gained nothing: two tiles ahead to L2, 26.5; the
  //   next tile to L1, keys and values, 34.
  // - L2 requests first: with the L1 requests first, 22.0 / 26.4 went to 27.0 / 30.4.
  HWY_INLINE void prefetch_ahead(const Lookahead& ahead, Index begin, Index end) const {
    const Index key_bytes = p_.dim * static_cast<Index>(sizeof(T));
    const Index value_bytes = p_.dim_v * static_cast<Index>(sizeof(T));
    for (Index t = begin; t < std::min(end, ahead.after_next.count()); ++t) {
      prefetch_row<kToL2>(ahead.after_next.keys[t], key_bytes);
      prefetch_row<kToL2>(ahead.after_next.values[t], value_bytes);
    }
    for (Index t = begin; t < std::min(end, ahead.next.count()); ++t) {
      prefetch_row<kToL1>(ahead.next.keys[t], key_bytes);
    }
  }

  // The keys of `rows` against the query rows [row_begin, row_end) of their KV head, while
  // the rows of the tiles `ahead` are asked for.
  void tile(const TileRows<T>& rows, const Lookahead& ahead, Index row_begin, Index row_end) {
    const Index count = rows.count();
    prefetch_values_to_l1(rows.values, count);
    for (Index r = row_begin; r < row_end; r += Traits::kRowBlock) {
      const Index block_rows = std::min<Index>(Traits::kRowBlock, row_end - r);
      score_rows(r, block_rows, rows, r == row_begin ? &ahead : nullptr);
    }
    for (Index r = row_begin; r < row_end; ++r) {
      softmax_row(r, rows);
    }
    for (Index r = row_begin; r < row_end; r += Traits::kRowBlock) {
      const Index block_rows = std::min<Index>(Traits::kRowBlock, row_end - r);
      accumulate(r, block_rows, rows);
    }
  }

  // Four keys a block for every row count: each chunk of a query row is then loaded once
  // for four multiply-adds. With two keys a block, GCC folded each query load into both
  // multiply-adds, and loads, not arithmetic, bound the loop (Hq = 32: 38 against 34 ns per
  // key and KV head with the cache in the CPU caches).
  static constexpr int kBlockKeys = 4;

  void score_rows(Index r0, Index block_rows, const TileRows<T>& rows, const Lookahead* ahead) {
    const T* const* keys = rows.keys;
    const Index count = rows.count();
    switch (block_rows) {
      case 4:
        return score_rows_n<4>(r0, keys, count, ahead);
      case 3:
        return score_rows_n<3>(r0, keys, count, ahead);
      case 2:
        return score_rows_n<2>(r0, keys, count, ahead);
      default:
        return score_rows_n<1>(r0, keys, count, ahead);
    }
  }

  // Scores keys [0, count) for rows [r0, r0 + NR). With `ahead`, asks for its rows as it
  // goes: as many as the keys scored so far, the rest at the end.
  template <int NR>
  void score_rows_n(Index r0, const T* const* keys, Index count, const Lookahead* ahead) {
    const float* q[NR];
    float* out[NR];
    for (int r = 0; r < NR; ++r) {
      q[r] = s_.queries.get() + (r0 + r) * p_.dim;
      out[r] = s_.scores.get() + (r0 + r) * Traits::kKeyTile;
    }
    const auto at = [&](Index k) {
      std::array<float*, NR> scores;
      for (int r = 0; r < NR; ++r) scores[r] = out[r] + k;
      return scores;
    };
    Index k = 0;
    for (; k + kBlockKeys <= count; k += kBlockKeys) {
      score_block<T, NR, kBlockKeys>(q, keys + k, p_.dim, at(k).data());
      if (ahead != nullptr) prefetch_ahead(*ahead, k, k + kBlockKeys);
    }
    for (; k < count; ++k) {
      score_block<T, NR, 1>(q, keys + k, p_.dim, at(k).data());
      if (ahead != nullptr) prefetch_ahead(*ahead, k, k + 1);
    }
    if (ahead != nullptr) prefetch_ahead(*ahead, count, ahead->count());
  }

  // Shapes row r's scores of the tile's keys (int8 scale, softcap, ALiBi, hiding), then
  // folds them into the row's running state and leaves the weights in place of the scores.
  void softmax_row(Index r, const TileRows<T>& rows) {
    const Index t0 = rows.t0, t1 = rows.t1;
    float* s = s_.scores.get() + r * Traits::kKeyTile;
    const Index first = std::max(s_.first_key[r], t0), end = std::min(s_.end_key[r], t1);
    if (first >= end) return;
    constexpr bool kInt8 = std::is_same_v<T, std::int8_t>;
    const DF df;
    const Index lanes = static_cast<Index>(hn::Lanes(df)), count = t1 - t0;
    const Index whole = count - count % lanes;
    const bool plain = !kInt8 && p_.softcap == 0.0 && p_.alibi_slopes.empty();
    if (!plain || first > t0 || end < t1) shape_scores(r, s, t0, t1, first, end, rows.key_scale);
    // A NaN the query sees makes the row NaN, as in the reference; hn::Max may drop it.
    VF max_v = hn::Set(df, kMinusInfinity);
    auto nan_seen = hn::FirstN(df, 0);
    for (Index t = 0; t < whole; t += lanes) {
      const VF x = hn::LoadU(df, s + t);
      max_v = hn::Max(max_v, x);
      nan_seen = hn::Or(nan_seen, hn::IsNaN(x));
    }
    float tile_max = hn::GetLane(hn::MaxOfLanes(df, max_v));
    bool has_nan = !hn::AllFalse(df, nan_seen);
    for (Index t = whole; t < count; ++t) {
      tile_max = std::max(tile_max, s[t]);
      has_nan = has_nan || std::isnan(s[t]);
    }
    if (has_nan) tile_max = std::numeric_limits<float>::quiet_NaN();
    if (tile_max == kMinusInfinity) {
      // Every visible key scored -inf: no weight, no value read.
      s_.first_key[r] = std::max(s_.first_key[r], t1);
      return;
    }
    float& m = s_.row_max[r];
    const float new_max = has_nan ? tile_max : std::max(m, tile_max);
    // exp(0) is exactly 1: skipping the call when the maximum holds changes no bit.
    const float rescale = m == kMinusInfinity ? 0.0f : m == new_max ? 1.0f : std::exp(m - new_max);
    m = new_max;
    VF sum_v = hn::Zero(df);
    const VF shift = hn::Set(df, new_max);
    for (Index t = 0; t < whole; t += lanes) {
      const VF weight = VectorExp(df, hn::Sub(hn::LoadU(df, s + t), shift));
      sum_v = hn::Add(sum_v, weight);
      hn::StoreU(weight, df, s + t);
    }
    float sum = hn::GetLane(hn::SumOfLanes(df, sum_v));
    for (Index t = whole; t < count; ++t) {
      s[t] = std::exp(s[t] - new_max);
      sum += s[t];
    }
    s_.row_sum[r] = s_.row_sum[r] * rescale + sum;
    if (rescale != 1.0f) {
      float* acc = s_.acc.get() + r * p_.dim_v;
      const Index whole_v = p_.dim_v - p_.dim_v % lanes;
      const VF factor = hn::Set(df, rescale);
      for (Index d = 0; d < whole_v; d += lanes) {
        hn::StoreU(hn::Mul(hn::LoadU(df, acc + d), factor), df, acc + d);
      }
      for (Index d = whole_v; d < p_.dim_v; ++d) acc[d] *= rescale;
    }
    if constexpr (kInt8) {
      for (Index t = 0; t < count; ++t) s[t] *= rows.value_scale[t];
    }
  }

  // Scores of row r that need more than the dot product: -inf outside the row's visible
  // keys [first, end), the int8 key scale, softcap and ALiBi inside.
  void shape_scores(Index r, float* s, Index t0, Index t1, Index first, Index end,
                    const float* key_scale) const {
    for (Index t = t0; t < t1; ++t) {
      float& x = s[t - t0];
      if (t < first || t >= end) {
        x = kMinusInfinity;
        continue;
      }
      if constexpr (std::is_same_v<T, std::int8_t>) x *= key_scale[t - t0];
      if (p_.softcap > 0.0) {
        x = static_cast<float>(p_.softcap * std::tanh(static_cast<double>(x) / p_.softcap));
      }
      if (!p_.alibi_slopes.empty()) {
        x -= s_.slope[r] * static_cast<float>(std::abs(s_.position[r] - t));
      }
    }
  }

  // Rows whose visible keys in the tile are the same range go together; a row at the edge
  // of a causal or window range goes alone, so it never reads a value row it may not see.
  void accumulate(Index r0, Index block_rows, const TileRows<T>& rows) {
    const T* const* values = rows.values;
    const Index t0 = rows.t0, t1 = rows.t1;
    const auto range = [&](Index r) {
      return std::pair{std::max(s_.first_key[r], t0) - t0, std::min(s_.end_key[r], t1) - t0};
    };
    bool same = true;
    for (Index r = r0 + 1; r < r0 + block_rows; ++r) same = same && range(r) == range(r0);
    if (same && block_rows == 4) return accumulate_n<4>(r0, values, range(r0));
    if (same && block_rows == 2) return accumulate_n<2>(r0, values, range(r0));
    for (Index r = r0; r < r0 + block_rows; ++r) accumulate_n<1>(r, values, range(r));
  }

  template <int NR>
  void accumulate_n(Index r0, const T* const* values, std::pair<Index, Index> keys) {
    if (keys.first >= keys.second) return;
    float* acc[NR];
    const float* p[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = s_.acc.get() + (r0 + r) * p_.dim_v;
      p[r] = s_.scores.get() + (r0 + r) * Traits::kKeyTile;
    }
    accumulate_rows<T, NR>(acc, p, values, keys.first, keys.second, p_.dim_v);
  }

  const DecodeProblem& p_;
  const Plan& plan_;
  Scratch& s_;
  State& partial_;
};

// state[s, head, i] = the partial states of sequence s's parts, merged in key order.
void merge_parts(const DecodeProblem& p, const Plan& plan, const State& partial, State& state) {
  const Index group = p.group_size(), n_q = p.queries, dim_v = p.dim_v;
  const float *pm = partial.m.data_as<float>(), *pl = partial.l.data_as<float>();
  const float* pacc = partial.acc.data_as<float>();
  float *m = state.m.data_as<float>(), *l = state.l.data_as<float>();
  float* acc = state.acc.data_as<float>();
  for (Index s = 0; s < p.sequences(); ++s)
    for (Index head = 0; head < p.heads_q; ++head)
      for (Index i = 0; i < n_q; ++i) {
        const Index out = (s * p.heads_q + head) * n_q + i;
        const Index kv_head = head / group;
        float& mo = m[out];
        float& lo = l[out];
        float* ao = acc + out * dim_v;
        for (std::size_t k = 0; k < plan.parts_of[s].size(); ++k) {
          const Index part = plan.parts_of[s][k], member = plan.member_index[s][k];
          const Index rows = static_cast<Index>(plan.parts[part].members.size()) * group * n_q;
          const Index in =
              plan.state_offset[part] + kv_head * rows + (member * group + head % group) * n_q + i;
          const float mi = pm[in];
          if (mi == kMinusInfinity) continue;  // an empty part changes nothing
          const float merged = std::isnan(mi) ? mi : std::max(mo, mi);
          const float w_out = mo == kMinusInfinity ? 0.0f : std::exp(mo - merged);
          const float w_in = std::exp(mi - merged);
          lo = lo * w_out + pl[in] * w_in;
          for (Index d = 0; d < dim_v; ++d) ao[d] = ao[d] * w_out + pacc[in * dim_v + d] * w_in;
          mo = merged;
        }
      }
}

template <class T>
void run(const DecodeProblem& p, State& state, int threads) {
  const Plan plan = make_plan(p);
  State partial{Tensor(DType::f32, {1, 1, plan.total_rows, 1}),
                Tensor(DType::f32, {1, 1, plan.total_rows, 1}),
                Tensor(DType::f32, {1, 1, plan.total_rows, p.dim_v})};
  const auto tasks = static_cast<std::int64_t>(plan.parts.size());
  Index key_rows = 0;
  for (const Part& part : plan.parts) key_rows += (part.key_end - part.key_begin) * p.heads_kv;
  const Index useful = std::min<Index>(tasks, key_rows / Traits::kMinKeysPerThread + 1);
  threads = static_cast<int>(std::max<Index>(1, std::min<Index>(threads, useful)));
  std::vector<Scratch> scratch;
  scratch.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) scratch.emplace_back(plan.max_rows, p.dim, p.dim_v);
#pragma omp parallel num_threads(threads)
  {
    TaskKernel<T> kernel(p, plan, scratch[static_cast<std::size_t>(omp_get_thread_num())], partial);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      kernel.run(task);
    }
  }
  merge_parts(p, plan, partial, state);
}

}  // namespace

void DecodeTarget(const DecodeProblem& problem, State& state, int threads) {
  switch (problem.cache->config().dtype) {
    case CacheDType::f32:
      return run<float>(problem, state, threads);
    case CacheDType::f16:
      return run<float16>(problem, state, threads);
    case CacheDType::bf16:
      return run<bfloat16>(problem, state, threads);
    case CacheDType::int8:
      return run<std::int8_t>(problem, state, threads);
  }
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(DecodeTarget);

void decode(const DecodeProblem& problem, State& state) {
  HWY_DYNAMIC_DISPATCH(DecodeTarget)(problem, state, resolve_threads(problem.threads));
}

}  // namespace attn::cpu
#endif
