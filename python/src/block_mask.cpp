#include "block_mask.hpp"

#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn/block_mask.hpp"
#include "attn/error.hpp"
#include "views.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace attn::python {
namespace {

using StripeArray = nb::ndarray<const bool, nb::ndim<4>, nb::c_contig, nb::device::cpu>;

const char* kind_name(BlockMask::Block kind) {
  switch (kind) {
    case BlockMask::Block::empty:
      return "empty";
    case BlockMask::Block::full:
      return "full";
    default:
      return "partial";
  }
}

BlockMask::Block kind_of(const std::string& name) {
  if (name == "empty") return BlockMask::Block::empty;
  if (name == "full") return BlockMask::Block::full;
  if (name == "partial") return BlockMask::Block::partial;
  throw Error("kind: expected 'empty', 'full' or 'partial', given '" + name + "'");
}

// stripe(qb) -> bool [batch, heads, rows of block qb, len_k], C-contiguous: each stripe is
// asked for once, since BlockMask::from_rows fills a query block for every (b, h) before
// the next.
BlockMask from_stripes(Index batch, Index heads, Index len_q, Index len_k, Index block_size,
                       const std::function<StripeArray(Index)>& stripe) {
  Index held = -1;
  std::optional<StripeArray> rows;
  return BlockMask::from_rows(
      batch, heads, len_q, len_k,
      [&](Index b, Index h, Index i, std::uint8_t* row) {
        const Index qb = i / block_size;
        if (qb != held) {
          rows = stripe(qb);
          held = qb;
          const Index count = std::min(block_size, len_q - qb * block_size);
          const bool fits = rows->shape(0) == static_cast<std::size_t>(batch) &&
                            rows->shape(1) == static_cast<std::size_t>(heads) &&
                            rows->shape(2) == static_cast<std::size_t>(count) &&
                            rows->shape(3) == static_cast<std::size_t>(len_k);
          if (!fits) {
            throw Error("predicate: expected a stripe of shape [" + std::to_string(batch) + ", " +
                        std::to_string(heads) + ", " + std::to_string(count) + ", " +
                        std::to_string(len_k) + "]");
          }
        }
        const bool* from =
            rows->data() + ((b * heads + h) * rows->shape(2) + i % block_size) * len_k;
        for (Index j = 0; j < len_k; ++j) row[j] = from[j] ? 1 : 0;
      },
      block_size);
}

}  // namespace

void bind_block_mask(nb::module_& m) {
  nb::class_<BlockMask>(m, "BlockMask", "attn::BlockMask (attn.BlockMask wraps it).")
      .def_static(
          "from_dense",
          [](const InputArray& mask, Index block_size) {
            return BlockMask::from_dense(input_view(mask, "mask", true), block_size);
          },
          "mask"_a, "block_size"_a)
      .def_static("from_stripes", &from_stripes, "batch"_a, "heads"_a, "len_q"_a, "len_k"_a,
                  "block_size"_a, "stripe"_a)
      .def_static(
          "documents",
          [](const std::vector<std::int64_t>& q, const std::vector<std::int64_t>& k, Index batch,
             Index block_size) { return BlockMask::documents(q, k, batch, block_size); },
          "query_documents"_a, "key_documents"_a, "batch"_a, "block_size"_a)
      .def_static(
          "prefix_lm",
          [](const std::vector<Index>& prefixes, Index len_q, Index len_k, Index block_size) {
            return BlockMask::prefix_lm(prefixes, len_q, len_k, block_size);
          },
          "prefix_lengths"_a, "len_q"_a, "len_k"_a, "block_size"_a)
      .def_static("chunked", &BlockMask::chunked, "chunk"_a, "len_q"_a, "len_k"_a, "block_size"_a)
      .def_static(
          "window_and_global",
          [](Index window, const std::vector<Index>& globals, Index len_q, Index len_k,
             Index block_size) {
            return BlockMask::window_and_global(window, globals, len_q, len_k, block_size);
          },
          "window"_a, "global_tokens"_a, "len_q"_a, "len_k"_a, "block_size"_a)
      .def_prop_ro("batch", &BlockMask::batch)
      .def_prop_ro("heads", &BlockMask::heads)
      .def_prop_ro("len_q", &BlockMask::len_q)
      .def_prop_ro("len_k", &BlockMask::len_k)
      .def_prop_ro("block_size", &BlockMask::block_size)
      .def_prop_ro("query_blocks", &BlockMask::query_blocks)
      .def_prop_ro("key_blocks", &BlockMask::key_blocks)
      .def(
          "block",
          [](const BlockMask& mask, Index b, Index h, Index qb, Index kb) {
            const bool inside = b >= 0 && b < mask.batch() && h >= 0 && h < mask.heads() &&
                                qb >= 0 && qb < mask.query_blocks() && kb >= 0 &&
                                kb < mask.key_blocks();
            if (!inside) throw Error("block: expected an index inside the mask's blocks");
            return std::string(kind_name(mask.block(b, h, qb, kb)));
          },
          "b"_a, "h"_a, "qb"_a, "kb"_a)
      .def(
          "count",
          [](const BlockMask& mask, const std::string& kind) { return mask.count(kind_of(kind)); },
          "kind"_a)
      .def("visible_fraction", &BlockMask::visible_fraction)
      .def_prop_ro("nbytes", &BlockMask::bytes)
      .def("to_dense", [](const BlockMask& mask) { return to_numpy(mask.to_dense()); });
}

}  // namespace attn::python
