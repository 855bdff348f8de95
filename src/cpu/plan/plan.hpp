// The plan of a call (docs/architecture.md, "The plan"): built once per problem from the
// request and the CPU before any work, it names the work items, the micro-kernel that scores
// every row chunk of an item, what q and K are packed into for it, and each item's context
// path. Forward and the weights pass walk the same items and chunks by it
// (cpu/walk/scorer-inl.h), so a weight equals forward's to the bit because both ran one
// scorer on one chunk, not because two files made the same choice.
//
// What decides a score depends on q, k and the options only, never on v: attn::weights,
// which has no v, plans the scores of attn::forward(q, k, v) for any v.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/tensor.hpp"
#include "core/problem.hpp"

namespace attn::cpu {

// The arithmetic that scores a chunk of rows against a tile of keys.
enum class ScoreKernel : std::uint8_t {
  float_chain,  // keys broadcast against q^T: one FMA chain over d per score, in order
  dot,          // q and k rows dotted along d, the lanes summed by one shuffle tree
  dot_bf16,     // the same on bf16 q and k rows by AVX512-BF16's vdpbf16ps, K read in place
  bf16_pairs,   // bf16 q and k by AVX512-BF16's vdpbf16ps, K read in place
  bf16_tiles,   // bf16 q and k on AMX tiles (TDPBF16PS), K read in place
  fp16_parts,   // fp16 q and k on AMX tiles as exact bf16 parts, K split once per call
};

// Whether a chunk scored by `kernel` is narrow: dot products, rows of q against rows of K.
inline bool scores_by_dot(ScoreKernel kernel) {
  return kernel == ScoreKernel::dot || kernel == ScoreKernel::dot_bf16;
}

// How a work item adds P V into its context.
enum class ContextKernel : std::uint8_t {
  float_rows,  // P broadcast against V rows in float32 (16-bit V widened per tile, or read in
               // place where every chunk of a tile is narrow)
  amx_tiles,   // O^T += V^T P^T on AMX tiles, V^T packed once per (segment, KV head)
  bf16_pairs,  // O^T += V^T P^T by AVX512-BF16's vdpbf16ps on P rounded to bf16, V^T packed
               // as for AMX tiles
};

const char* kernel_name(ScoreKernel kernel);
const char* kernel_name(ContextKernel kernel);

// The Highway target the kernels were compiled for and the CPU they run on, as the plan
// needs them (PlanTarget::of_this_cpu fills the CPU's part; tests may name any).
struct PlanTarget {
  Index lanes = 1;        // float32 lanes of a vector
  bool avx512 = false;    // an x86 AVX-512 target: bf16 dot products and AMX may serve
  bool bf16_dot = false;  // bf16 products pay on the CPU's vdpbf16ps (bf16_dot_pays)
  bool amx = false;       // the CPU runs AMX tiles and Linux granted them (has_amx)

  static PlanTarget of_this_cpu(Index lanes, bool avx512);
};

// One unit of parallel work: the rows of query positions [first_position, first_position +
// positions) of a segment, every query head of KV head kv_head at each position (row
// t * group + g is head kv_head * group + g at position first_position + t). Its result
// depends on nothing else, so any thread count gives the same bits.
struct WorkItem {
  Index segment = 0, kv_head = 0, first_position = 0, positions = 0;
};

// A row chunk of an item: rows [first_row, first_row + rows) of it, in `vectors` vectors.
struct ChunkRows {
  Index first_row = 0, rows = 0, vectors = 0;
  ScoreKernel scores = ScoreKernel::float_chain;
};

class Plan {
 public:
  Plan(const core::Problem& problem, PlanTarget target);

  Index lanes() const { return lanes_; }
  // Keys per tile; an item's tiles start at the first key any of its rows sees.
  Index key_tile() const { return key_tile_; }
  // Rows of a chunk: the score micro-kernel's row vectors.
  Index chunk_rows() const { return chunk_rows_; }
  Index positions_per_item() const { return positions_per_item_; }
  // Rows of the largest item, padded to whole vectors: what per-thread scratch holds.
  Index rows_per_item() const { return rows_per_item_; }

  // The kernel of chunks of more than half a vector of rows, and of a chunk of `rows`.
  ScoreKernel wide_scores() const { return wide_scores_; }
  // The kernel of chunks of at most half a vector of rows: dot or dot_bf16.
  ScoreKernel narrow_scores() const { return narrow_scores_; }
  ScoreKernel chunk_scores(Index rows) const {
    return narrow(rows) ? narrow_scores_ : wide_scores_;
  }
  // The chunks of an item of `rows` rows, in order; every item's chunks start at its row 0.
  std::vector<ChunkRows> chunks(Index rows) const;

  // Tiles whose chunks are all narrow read 16-bit K and V rows where they lie (decoding):
  // 16-bit K and V of one dtype, no mask (a masked key's V row would meet a weight of 0).
  bool narrow_tiles_in_place() const { return narrow_in_place_; }
  // Those tiles' P V of bf16 V by vdpbf16ps on P rounded to bf16 (pv_precision bf16), where
  // their scores are dot_bf16 and dim_v a multiple of 32 (tile::context_by_pairs_bf16).
  bool narrow_context_on_pairs() const { return narrow_pairs_; }
  // Wide chunks on fp16 parts read K's parts, split once before the items (KeyParts).
  bool splits_keys() const { return splits_keys_; }
  // Some item multiplies P V on bf16 products (AMX tiles or vdpbf16ps), and V^T is packed
  // before the items.
  bool packs_values() const { return packed_context_ != ContextKernel::float_rows; }
  // bf16 parts of each weight in those products: kWeightParts (exact, AMX tiles only), or for
  // Options::pv_precision bf16 1 (rounded), kFp16VWeightParts for fp16 V (cpu/amx/context.hpp).
  int weight_parts() const { return weight_parts_; }
  // An item's context path: the packed context where V^T is packed and no chunk of the item
  // is narrow (narrow chunks read V by rows), else float rows.
  ContextKernel context_of(const WorkItem& item) const;

  const std::vector<WorkItem>& items() const { return items_; }
  // The item holding query position i of a segment for KV head kv_head.
  Index item_of(Index segment, Index kv_head, Index i) const;

  // One line per choice, for attn::explain: the kernels and why.
  std::string describe() const;

 private:
  bool narrow(Index rows) const { return rows * 2 <= lanes_; }
  bool has_narrow_chunk(Index rows) const;

  Index lanes_, group_, heads_kv_, key_tile_, chunk_rows_, positions_per_item_, rows_per_item_ = 0;
  ScoreKernel wide_scores_ = ScoreKernel::float_chain, narrow_scores_ = ScoreKernel::dot;
  ContextKernel packed_context_ = ContextKernel::float_rows;
  bool narrow_in_place_ = false, narrow_pairs_ = false, splits_keys_ = false;
  int weight_parts_ = 0;
  std::vector<WorkItem> items_;
  std::vector<Index> first_item_;  // [segments * heads_kv]: index of each one's first item
};

}  // namespace attn::cpu
