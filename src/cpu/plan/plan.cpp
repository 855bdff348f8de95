#include "cpu/plan/plan.hpp"

#include <algorithm>
#include <bit>
#include <string>

#include "core/element_type.hpp"
#include "cpu/amx/context.hpp"
#include "cpu/amx/scores.hpp"
#include "cpu/amx/tiles.hpp"
#include "cpu/bf16_dot.hpp"
#include "cpu/plan/traits.hpp"

namespace attn::cpu {
namespace {

using core::round_up;
using Traits = WalkTraits;

// Rows per KV head, at least, for the AMX context: below, packing V^T costs as much as the
// products it serves.
constexpr Index kAmxContextMinRows = 64;

// The kernel of wide chunks: the float chain, or for bf16 q and k on an AVX-512 target AMX
// tiles where the CPU has them and the head dim fits, else (an even head dim) vdpbf16ps where
// it pays on the CPU; or for fp16 q and k on a CPU with AMX (head dims up to 128 in steps of
// 16, K's parts within the packing cap) AMX tiles on their exact bf16 parts.
ScoreKernel wide_kernel(const core::Problem& p, const PlanTarget& target) {
  if (!target.avx512) return ScoreKernel::float_chain;
  if (p.q.dtype == DType::bf16 && p.k.dtype == DType::bf16) {
    if (amx_scores_fit(p.dim_qk) && target.amx) return ScoreKernel::bf16_tiles;
    if (p.dim_qk % 2 == 0 && target.bf16_dot) return ScoreKernel::bf16_pairs;
  }
  if (p.q.dtype == DType::f16 && p.k.dtype == DType::f16 && amx_scores_fit(2 * p.dim_qk) &&
      4 * p.batch * p.heads_kv * p.total_k * p.dim_qk <= kAmxPackedMaxBytes && target.amx) {
    return ScoreKernel::fp16_parts;
  }
  return ScoreKernel::float_chain;
}

// The kernel of narrow chunks: dot products, on bf16 pairs for bf16 q and k on an AVX-512
// target of a CPU where vdpbf16ps pays (any head dim: the last pairs past it read as zero).
ScoreKernel narrow_kernel(const core::Problem& p, const PlanTarget& target) {
  return target.avx512 && target.bf16_dot && p.q.dtype == DType::bf16 && p.k.dtype == DType::bf16
             ? ScoreKernel::dot_bf16
             : ScoreKernel::dot;
}

// The context of items with wide chunks on bf16 products, V^T packed: AMX tiles where the
// scores take them and V has their dtype (bf16, or fp16 as exact parts); else for bf16 V
// with P rounded (pv_precision bf16) vdpbf16ps beside the AVX512-BF16 scores; else none
// (float rows), as for exact P without AMX, where three parts by vdpbf16ps would cost more
// than float32 FMAs.
ContextKernel packed_context(const core::Problem& p, ScoreKernel wide) {
  if ((wide == ScoreKernel::bf16_tiles && p.v.dtype == DType::bf16) ||
      (wide == ScoreKernel::fp16_parts && p.v.dtype == DType::f16)) {
    return ContextKernel::amx_tiles;
  }
  if (wide == ScoreKernel::bf16_pairs && p.v.dtype == DType::bf16 &&
      p.pv_precision == PvPrecision::bf16) {
    return ContextKernel::bf16_pairs;
  }
  return ContextKernel::float_rows;
}

// Keys per tile (WalkTraits): fewer at the widest heads, whose rows fill the scratch; more
// where AMX tiles score wide bf16 heads.
Index key_tile_of(const core::Problem& p, ScoreKernel wide) {
  if (p.dim_qk >= Traits::kWideDim) return Traits::kWideKeyTile;
  if (wide == ScoreKernel::bf16_tiles && p.dim_qk >= Traits::kAmxWideDim) {
    return Traits::kAmxKeyTile;
  }
  return Traits::kKeyTile;
}

// bf16 parts of a value in the packed V^T: 1 for bf16 V, 2 for fp16 V.
Index value_parts(const core::Problem& p) {
  return p.v.dtype == DType::f16 ? 2 : 1;
}

}  // namespace

PlanTarget PlanTarget::of_this_cpu(Index lanes, bool avx512) {
  return {lanes, avx512, avx512 && bf16_dot_pays(), avx512 && has_amx()};
}

const char* kernel_name(ScoreKernel kernel) {
  switch (kernel) {
    case ScoreKernel::float_chain:
      return "float32 FMA chains over d, keys broadcast against q^T";
    case ScoreKernel::dot:
      return "dot products along d";
    case ScoreKernel::dot_bf16:
      return "AVX512-BF16 dot products along d (vdpbf16ps)";
    case ScoreKernel::bf16_pairs:
      return "AVX512-BF16 dot products (vdpbf16ps)";
    case ScoreKernel::bf16_tiles:
      return "AMX bf16 tiles";
    case ScoreKernel::fp16_parts:
      return "AMX bf16 tiles on the exact bf16 parts of fp16";
  }
  return "?";
}

const char* kernel_name(ContextKernel kernel) {
  switch (kernel) {
    case ContextKernel::float_rows:
      return "float32 FMAs, P broadcast against V rows";
    case ContextKernel::amx_tiles:
      return "AMX bf16 tiles, V^T packed per KV head";
    case ContextKernel::bf16_pairs:
      return "AVX512-BF16 dot products (vdpbf16ps), V^T packed per KV head";
  }
  return "?";
}

Plan::Plan(const core::Problem& p, PlanTarget target)
    : lanes_(target.lanes),
      group_(p.group_size()),
      heads_kv_(p.heads_kv),
      key_tile_(Traits::kKeyTile),
      chunk_rows_(Traits::kScoreRowVectors * target.lanes) {
  // Rows per item: more where K tiles are widened, so that more rows share each conversion.
  // K's dtype alone decides, so that a weights call (v = k) plans forward's items.
  const Index rows = Traits::kRowVectorsPerItem * lanes_;
  const Index wanted =
      p.k.dtype == DType::f32 ? rows : std::max<Index>(rows, Traits::kWidenedRowsPerItem);
  positions_per_item_ = std::max<Index>(1, wanted / group_);
  // Items of a masked call hold a power of two of positions: they never straddle a block
  // mask's blocks (powers of two), which would score both blocks for all their rows, and a
  // dense mask runs the items of the block mask of its pattern (the same bits).
  if (p.mask_kind != core::MaskKind::none) {
    positions_per_item_ =
        static_cast<Index>(std::bit_ceil(static_cast<std::uint64_t>(positions_per_item_)));
  }
  wide_scores_ = wide_kernel(p, target);
  key_tile_ = key_tile_of(p, wide_scores_);
  narrow_scores_ = narrow_kernel(p, target);
  narrow_in_place_ = p.mask_kind == core::MaskKind::none && p.k.dtype == p.v.dtype &&
                     (p.k.dtype == DType::f16 || p.k.dtype == DType::bf16);
  narrow_pairs_ = narrow_in_place_ && narrow_scores_ == ScoreKernel::dot_bf16 &&
                  p.v.dtype == DType::bf16 && p.pv_precision == PvPrecision::bf16 &&
                  p.dim_v % 32 == 0;

  bool any_wide = false, enough_rows = false;
  Index packed_bytes = 0;
  for (std::size_t s = 0; s < p.segments.size(); ++s) {
    const core::Segment& segment = p.segments[s];
    const Index first_rows = std::min(positions_per_item_, segment.len_q) * group_;
    // A segment's first item is its largest, and its first chunk the largest of that.
    any_wide |= segment.len_q > 0 && !narrow(std::min(first_rows, chunk_rows_));
    enough_rows |= segment.len_q * group_ >= kAmxContextMinRows;
    packed_bytes += 2 * value_parts(p) * p.heads_kv * round_up(p.dim_v, kAmxRows) *
                    packed_values_stride(segment.len_k);
    rows_per_item_ = std::max(rows_per_item_, round_up(first_rows, lanes_));
    for (Index kv_head = 0; kv_head < p.heads_kv; ++kv_head) {
      first_item_.push_back(static_cast<Index>(items_.size()));
      for (Index i = 0; i < segment.len_q; i += positions_per_item_) {
        items_.push_back(
            {static_cast<Index>(s), kv_head, i, std::min(positions_per_item_, segment.len_q - i)});
      }
    }
  }
  splits_keys_ = wide_scores_ == ScoreKernel::fp16_parts && any_wide;
  if (enough_rows && packed_bytes <= kAmxPackedMaxBytes) {
    packed_context_ = packed_context(p, wide_scores_);
  }
  weight_parts_ = p.pv_precision == PvPrecision::exact ? kWeightParts
                  : p.v.dtype == DType::f16            ? kFp16VWeightParts
                                                       : 1;
}

std::vector<ChunkRows> Plan::chunks(Index rows) const {
  std::vector<ChunkRows> out;
  const Index vectors = round_up(rows, lanes_) / lanes_;
  for (Index v = 0; v < vectors; v += Traits::kScoreRowVectors) {
    ChunkRows chunk;
    chunk.first_row = v * lanes_;
    chunk.vectors = std::min<Index>(Traits::kScoreRowVectors, vectors - v);
    chunk.rows = std::min(rows, chunk.first_row + chunk.vectors * lanes_) - chunk.first_row;
    chunk.scores = chunk_scores(chunk.rows);
    out.push_back(chunk);
  }
  return out;
}

bool Plan::has_narrow_chunk(Index rows) const {
  for (Index first = 0; first < rows; first += chunk_rows_) {
    if (narrow(std::min(rows, first + chunk_rows_) - first)) return true;
  }
  return false;
}

ContextKernel Plan::context_of(const WorkItem& item) const {
  return packs_values() && !has_narrow_chunk(item.positions * group_) ? packed_context_
                                                                      : ContextKernel::float_rows;
}

Index Plan::item_of(Index segment, Index kv_head, Index i) const {
  return first_item_[static_cast<std::size_t>(segment * heads_kv_ + kv_head)] +
         i / positions_per_item_;
}

std::string Plan::describe() const {
  std::string out = "scores: ";
  out += kernel_name(wide_scores_);
  out += " for chunks of more than " + std::to_string(lanes_ / 2) + " rows, ";
  out += kernel_name(narrow_scores_);
  out += " for fewer";
  if (narrow_in_place_) out += " (K and V read where they lie)";
  if (narrow_pairs_) {
    out += "; context of tiles of only those: ";
    out += "AVX512-BF16 dot products (vdpbf16ps) on V rows paired key by key (P rounded to ";
    out += "bf16, pv_precision bf16)";
  }
  out += "; context: ";
  out += kernel_name(packed_context_);
  if (packs_values()) {
    out += weight_parts_ == 1                   ? " (P rounded to bf16, pv_precision bf16)"
           : weight_parts_ == kFp16VWeightParts ? " (P in two bf16 parts, pv_precision bf16)"
                                                : " (P in three exact bf16 parts)";
    out += " for items without narrow chunks, ";
    out += kernel_name(ContextKernel::float_rows);
    out += " for the others";
  }
  return out;
}

}  // namespace attn::cpu
