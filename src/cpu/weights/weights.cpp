// The fast weights pass: alpha = exp(s - lse) for the requested rows, from the very scores
// forward makes: the same plan, its items and chunks, and the same scorer
// (cpu/walk/scorer-inl.h). Per item that holds a requested row, two walks over its tiles:
//   statistics    (when no lse is given, and for top-k) the walk's online softmax, as
//                 forward runs it, gives each row forward's m and l, so forward's lse;
//                 top-k offers each requested row's shaped scores to a k-sized heap, since
//                 exp(s - lse) ranks keys as s does
//   emit          alpha = exp(s - shift) * factor (tile::weight_of_score, shift and factor
//                 from the lse) in place of the chunk's scores, a vector of rows at a time,
//                 then each requested row's keys written out of S^T (Scorer::write_rows)
// attn::forward hands over its kernel's lse (a float64 copy), and then the statistics walk is
// skipped. Only chunks holding a requested row are scored: a chunk's scores and softmax
// depend on its own rows alone, and the item's tiles on its rows' key ranges. Hidden keys get
// exactly 0, and a NaN in a hidden key never reaches a weight. Extra memory per thread: the
// walk's tiles, and for top-k a heap of k per row of an item; never Lq x Lk.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/weights/weights.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attn/half.hpp"
#include "core/element_type.hpp"
#include "core/problem.hpp"
#include "core/weight_request.hpp"
#include "cpu/plan/plan.hpp"
#include "cpu/threads.hpp"
#include "cpu/tile/state.hpp"
#include "cpu/weights/top_k.hpp"
#include "cpu/weights/weights.hpp"

#include "cpu/amx/key_parts-inl.h"
#include "cpu/tile/run-inl.h"
#include "cpu/tile/softmax-inl.h"
#include "cpu/tile/target-inl.h"
#include "cpu/tile/to_floats-inl.h"
#include "cpu/walk/scorer-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace {

using core::Problem;
using core::row_of;
using core::WeightRequest;
using core::with_float_type;
using tile::DF;
using tile::VF;
using walk::Chunk;
using walk::TileChunks;
using walk::WideScores;
namespace hn = hwy::HWY_NAMESPACE;

// One output row: row r of a plan item, written to weights[batch, out_head, out_row, :].
struct RowRequest {
  Index item = 0, r = 0, out_head = 0, out_row = 0;
};

// The requests of one item: requests[first, first + count).
struct ItemRequests {
  Index first = 0, count = 0;
};

// Per-thread scratch beside the walk's.
struct Scratch {
  Scratch(const Plan& plan, Index heap_capacity)
      : scores(tile::scratch_buffer<float>(heap_capacity)),
        weights(tile::scratch_buffer<float>(heap_capacity)),
        shift(tile::scratch_buffer<float>(plan.rows_per_item())),
        factor(tile::scratch_buffer<float>(plan.rows_per_item())),
        heap(static_cast<std::size_t>(plan.rows_per_item() * heap_capacity)) {}

  hwy::AlignedFreeUniquePtr<float[]> scores, weights;  // a row's top-k, and their weights
  // [rows]: alpha = exp(s - shift) * factor (WeightScale); 0 and 0 for rows not requested
  hwy::AlignedFreeUniquePtr<float[]> shift, factor;
  std::vector<Candidate> heap;  // [rows][heap_capacity]
};

template <WideScores kWide>
class ItemKernel {
 public:
  ItemKernel(const Problem& problem, const Plan& plan, const WeightRequest& request,
             const std::vector<RowRequest>& requests, walk::ScorerScratch& scorer_scratch,
             Scratch& scratch, const KeyParts& key_parts, Index heap_capacity)
      : p_(problem),
        plan_(plan),
        r_(request),
        requests_(requests),
        scorer_(problem, plan, scorer_scratch, key_parts),
        s_(scratch),
        heap_capacity_(heap_capacity) {}

  void run(const ItemRequests& item) {
    first_ = item.first;
    end_ = item.first + item.count;
    const WorkItem& work = plan_.items()[static_cast<std::size_t>(requests_[first_].item)];
    scorer_.start(work);
    const bool top_k = r_.top_k.has_value();
    for (Index at = first_; at < end_; ++at) {
      const Index r = requests_[at].r;
      best(r) = TopK(s_.heap.data() + r * heap_capacity_, heap_capacity_);
    }
    if (!r_.lse || top_k) walk_tiles(Pass::statistics);
    std::fill(s_.shift.get(), s_.shift.get() + scorer_.rows_padded(), 0.0f);
    std::fill(s_.factor.get(), s_.factor.get() + scorer_.rows_padded(), 0.0f);
    for (Index at = first_; at < end_; ++at) {
      const Index r = requests_[at].r;
      const WeightScale scale = weight_scale_of_lse(lse_of(r));
      s_.shift[r] = scale.shift;
      s_.factor[r] = scale.factor;
    }
    if (top_k) {
      for (Index at = first_; at < end_; ++at) write_top_k(requests_[at]);
      return;
    }
    for (Index at = first_; at < end_; ++at) zero_unwritten(requests_[at]);
    walk_tiles(Pass::emit);
  }

 private:
  enum class Pass : std::uint8_t { statistics, emit };

  TopK& best(Index r) { return best_[static_cast<std::size_t>(r)]; }

  // Forward's lse of row r: its own statistics' (the walk's end of row), or the one given.
  double lse_of(Index r) const {
    if (r_.lse && !r_.top_k) {
      return *row_of<double>(*r_.lse, scorer_.segment().batch, scorer_.head(r),
                             scorer_.query_row(r));
    }
    return scorer_.row_end(r).lse;
  }

  // The item's tiles as forward walks them; each chunk holding a requested row is scored,
  // shaped, and then folded into the softmax (statistics) or written out (emit).
  void walk_tiles(Pass pass) {
    const auto [first, end] = scorer_.item_keys();
    for (Index tile = first; tile < end; tile += plan_.key_tile()) {
      const Index tile_end = std::min<Index>(tile + plan_.key_tile(), end);
      const TileChunks chunks = scorer_.plan_tile(tile, tile_end);
      if (chunks.count == 0) continue;
      if (plan_.narrow_tiles_in_place() && chunks.all_narrow) {
        with_float_type(p_.k.dtype, [&](auto tag) {
          using T = decltype(tag);
          if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
            const T* keys[WalkTraits::kMostTileKeys];
            scorer_.stored_key_rows(tile_end, keys);
            for_requested_chunks(chunks, [&](const Chunk& chunk) {
              scorer_.score_in_place(chunk, keys);
              after_scores(chunk, pass);
            });
          }
        });
        continue;
      }
      bool loaded = false;
      for_requested_chunks(chunks, [&](const Chunk& chunk) {
        if (!loaded && scorer_.reads_float_keys(chunks)) {
          scorer_.load_keys(tile, tile_end);
          loaded = true;
        }
        scorer_.score(chunk);
        after_scores(chunk, pass);
      });
    }
  }

  template <class Fn>
  void for_requested_chunks(const TileChunks& chunks, Fn&& fn) {
    for (Index c = 0; c < chunks.count; ++c) {
      const Chunk& chunk = chunks.chunks[c];
      if (holds_request(chunk)) fn(chunk);
    }
  }

  bool holds_request(const Chunk& chunk) const {
    for (Index at = first_; at < end_; ++at) {
      const Index r = requests_[at].r;
      if (r >= chunk.first_row && r < chunk.row_end()) return true;
    }
    return false;
  }

  void after_scores(const Chunk& chunk, Pass pass) {
    scorer_.shape(chunk);
    if (pass == Pass::emit) return emit(chunk);
    if (r_.top_k) offer(chunk);
    scorer_.softmax(chunk);
  }

  // Keys [first, end) of the chunk's tile that row r sees.
  std::pair<Index, Index> row_keys(const Chunk& chunk, Index r) const {
    return {std::max<Index>(scorer_.first_key(r), chunk.first),
            std::min<Index>(scorer_.end_key(r), chunk.end)};
  }

  // The requested rows' scores of the chunk offered to their heaps in key order.
  void offer(const Chunk& chunk) {
    Index last = -1;
    for (Index at = first_; at < end_; ++at) {
      const Index r = requests_[at].r;
      if (r == last || r < chunk.first_row || r >= chunk.row_end()) continue;
      last = r;
      const auto [first, end] = row_keys(chunk, r);
      TopK& heap = best(r);
      for (Index j = first; j < end; ++j) {
        const float s = *scorer_.scores_at(j, r);
        if (s > heap.threshold()) heap.offer(s, j);
      }
    }
  }

  // A dense output row's zeros: the keys its row does not see, and, where a mask may hide
  // the row's keys of a whole tile from its chunk (whose scores are then never made), the
  // rest too; emit overwrites the keys it scores.
  void zero_unwritten(const RowRequest& request) {
    const Index r = request.r, k_begin = scorer_.segment().k_begin;
    const bool masked = p_.mask_kind != core::MaskKind::none;
    const Index first = masked ? 0 : k_begin + scorer_.first_key(r);
    const Index end = masked ? 0 : std::max(first, k_begin + scorer_.end_key(r));
    with_output_row(request, [&](auto* out) {
      using T = std::remove_pointer_t<decltype(out)>;
      std::fill(out, out + first, T{});
      std::fill(out + end, out + r_.weights.shape[3], T{});
    });
  }

  // The chunk's weights exp(s - shift) * factor in place of its scores, a vector of rows at a
  // time (weight_of_score, lane by lane: the bits weights_of_scores gives a row), each
  // requested row's keys then copied into its output row while the vector's are in L1.
  void emit(const Chunk& chunk) {
    const DF df;
    const Index lanes = tile::lanes();
    for (Index c = 0; c < chunk.vectors; ++c) {
      const Index row = chunk.first_row + c * lanes;
      const VF shift = hn::Load(df, s_.shift.get() + row);
      const VF factor = hn::Load(df, s_.factor.get() + row);
      for (Index j = chunk.first; j < chunk.end; ++j) {
        float* at = scorer_.scores_at(j, row);
        hn::Store(tile::weight_of_score(df, hn::Load(df, at), shift, factor), df, at);
      }
      const Index row_end = std::min(row + lanes, chunk.row_end());
      Index at = first_;
      while (at < end_ && requests_[at].r < row) ++at;
      while (at < end_ && requests_[at].r < row_end) at += write_rows(chunk, at, row_end);
    }
  }

  // Writes the request at `at` (rows below row_end), or the four requests there when they
  // are of rows r .. r + 3 (Scorer::write_rows); returns how many it wrote.
  Index write_rows(const Chunk& chunk, Index at, Index row_end) {
    const Index r = requests_[at].r;
    bool four = at + 3 < end_;
    for (Index i = 1; i < 4 && four; ++i) four = requests_[at + i].r == r + i && r + i < row_end;
    const Index count = four ? 4 : 1;
    with_float_type(r_.weights.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* out[4];
      for (Index i = 0; i < count; ++i) {
        const RowRequest& request = requests_[at + i];
        out[i] = row_of<T>(r_.weights, scorer_.segment().batch, request.out_head, request.out_row) +
                 scorer_.segment().k_begin;
      }
      scorer_.write_rows(chunk, r, count, out);
    });
    return count;
  }

  template <class Fn>
  void with_output_row(const RowRequest& request, Fn&& fn) const {
    const MutableTensorView& out = r_.weights;
    with_float_type(out.dtype, [&](auto tag) {
      fn(row_of<decltype(tag)>(out, scorer_.segment().batch, request.out_head, request.out_row));
    });
  }

  // The heap, best first, as weights (weights_of_scores, as emit makes them) and key
  // indices; padding past the keys the row saw.
  void write_top_k(const RowRequest& request) {
    const Index r = request.r;
    TopK& heap = best(r);  // a repeated row sorts it again, to the same order
    const Candidate* sorted = heap.sorted();
    const Index count = heap.size();
    float* scores = s_.scores.get();
    for (Index t = 0; t < count; ++t) scores[t] = sorted[t].score;
    float* weights = s_.weights.get();
    tile::weights_of_scores(scores, count, {s_.shift[r], s_.factor[r]}, weights);
    const Index k = r_.weights.shape[3];
    with_output_row(request, [&](auto* out) {
      using T = std::remove_pointer_t<decltype(out)>;
      from_floats(weights, count, out);
      std::fill(out + count, out + k, T{});
    });
    const Index b = scorer_.segment().batch;
    const Index at =
        ((b * r_.weights.shape[1] + request.out_head) * r_.weights.shape[2] + request.out_row) * k;
    const Index k_begin = scorer_.segment().k_begin;
    for (Index t = 0; t < k; ++t) r_.indices[at + t] = t < count ? k_begin + sorted[t].key : -1;
  }

  const Problem& p_;
  const Plan& plan_;
  const WeightRequest& r_;
  const std::vector<RowRequest>& requests_;
  walk::Scorer<0, kWide> scorer_;
  Scratch& s_;
  const Index heap_capacity_;
  std::vector<TopK> best_ = std::vector<TopK>(static_cast<std::size_t>(plan_.rows_per_item()));
  Index first_ = 0, end_ = 0;  // the item's requests
};

// The request's rows by plan item (then by row of the item), and the items that hold them.
std::vector<RowRequest> row_requests(const Problem& p, const Plan& plan,
                                     const WeightRequest& request,
                                     std::vector<ItemRequests>& items) {
  std::vector<RowRequest> out;
  const Index group = p.group_size();
  for (const core::WeightRow& row : core::weight_rows(p, request)) {
    const Index kv_head = row.head / group;
    const Index item = plan.item_of(row.segment, kv_head, row.i);
    const WorkItem& work = plan.items()[static_cast<std::size_t>(item)];
    out.push_back({item, (row.i - work.first_position) * group + row.head % group, row.out_head,
                   row.out_row});
  }
  std::stable_sort(out.begin(), out.end(), [](const RowRequest& a, const RowRequest& b) {
    return a.item < b.item || (a.item == b.item && a.r < b.r);
  });
  for (Index at = 0; at < static_cast<Index>(out.size()); ++at) {
    if (items.empty() || out[static_cast<std::size_t>(items.back().first)].item !=
                             out[static_cast<std::size_t>(at)].item) {
      items.push_back({at, 0});
    }
    ++items.back().count;
  }
  return out;
}

template <WideScores kWide>
void run(const Problem& p, const Plan& plan, const WeightRequest& request, int threads) {
  std::vector<ItemRequests> items;
  const std::vector<RowRequest> requests = row_requests(p, plan, request, items);
  if (items.empty()) return;
  // Rows never see more than total_k keys, so a larger k needs no larger heap.
  const Index heap_capacity = request.top_k ? std::min(*request.top_k, p.total_k) : 0;
  const KeyParts key_parts(p, plan, threads);
  threads = tile::threads_for(static_cast<Index>(items.size()), threads);
  std::vector<walk::ScorerScratch> scorer_scratch;
  std::vector<Scratch> scratch;
  scorer_scratch.reserve(static_cast<std::size_t>(threads));
  scratch.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    scorer_scratch.emplace_back(plan, p.dim_qk);
    scratch.emplace_back(plan, heap_capacity);
  }
  tile::run_items(static_cast<Index>(items.size()), threads, [&](int thread) {
    const auto t = static_cast<std::size_t>(thread);
    return [&, kernel = ItemKernel<kWide>(p, plan, request, requests, scorer_scratch[t], scratch[t],
                                          key_parts, heap_capacity)](Index i) mutable {
      kernel.run(items[static_cast<std::size_t>(i)]);
    };
  });
}

}  // namespace

void WeightsTarget(const Problem& p, const WeightRequest& request, int threads) {
  const Plan plan(p, PlanTarget::of_this_cpu(tile::lanes(), tile::kAvx512Target));
  walk::with_wide_scores(plan,
                         [&](auto wide) { run<decltype(wide)::value>(p, plan, request, threads); });
}

}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu {

HWY_EXPORT(WeightsTarget);

void weights(const core::Problem& problem, const core::WeightRequest& request) {
  HWY_DYNAMIC_DISPATCH(WeightsTarget)(problem, request, resolve_threads(problem.threads));
}

}  // namespace attn::cpu
#endif
