// attn::BlockMask: a pattern classified block by block as it is built, a block-row stripe
// (block_size query rows of one batch entry and head) at a time, so that building one holds
// a stripe of flags, never the Lq x Lk array.
#include "attn/block_mask.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/argument_checks.hpp"

namespace attn {
namespace {

using core::fail;

void check_positive(const char* name, Index value) {
  if (value <= 0) fail(name, "a positive size", std::to_string(value));
}

void check_block_size(Index block_size) {
  if (block_size < BlockMask::kMinBlockSize || block_size > BlockMask::kMaxBlockSize ||
      !std::has_single_bit(static_cast<std::uint64_t>(block_size))) {
    fail("block_size", "a power of two from 16 to 1024", std::to_string(block_size));
  }
}

}  // namespace

BlockMask BlockMask::from_rows(Index batch, Index heads, Index len_q, Index len_k,
                               const RowFill& fill, Index block_size) {
  check_positive("batch", batch);
  check_positive("heads", heads);
  check_positive("len_q", len_q);
  check_positive("len_k", len_k);
  check_block_size(block_size);
  auto data = std::make_shared<Data>();
  Data& d = *data;
  d.batch = batch;
  d.heads = heads;
  d.len_q = len_q;
  d.len_k = len_k;
  d.block_size = block_size;
  d.query_blocks = (len_q + block_size - 1) / block_size;
  d.key_blocks = (len_k + block_size - 1) / block_size;
  d.words = (block_size + 63) / 64;
  const auto blocks = static_cast<std::size_t>(batch * heads * d.query_blocks * d.key_blocks);
  if (blocks > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    fail("len_q", "at most 2^31 blocks in all", std::to_string(blocks) + " blocks");
  }
  d.kinds.resize(blocks);
  d.partial.assign(blocks, -1);
  // A stripe of block_size rows of flags, and per key block its shown count.
  std::vector<std::uint8_t> stripe(static_cast<std::size_t>(block_size * len_k));
  std::vector<Index> shown(static_cast<std::size_t>(d.key_blocks));
  for (Index qb = 0; qb < d.query_blocks; ++qb) {
    for (Index b = 0; b < batch; ++b) {
      for (Index h = 0; h < heads; ++h) {
        const Index i0 = qb * block_size, rows = std::min(block_size, len_q - i0);
        for (Index r = 0; r < rows; ++r) {
          std::uint8_t* row = stripe.data() + r * len_k;
          std::fill_n(row, len_k, std::uint8_t{0});
          fill(b, h, i0 + r, row);
        }
        std::fill(shown.begin(), shown.end(), 0);
        for (Index r = 0; r < rows; ++r) {
          const std::uint8_t* row = stripe.data() + r * len_k;
          for (Index j = 0; j < len_k; ++j)
            shown[static_cast<std::size_t>(j / block_size)] += row[j] != 0;
        }
        for (Index kb = 0; kb < d.key_blocks; ++kb) {
          const Index j0 = kb * block_size, cols = std::min(block_size, len_k - j0);
          const Index index = ((b * heads + h) * d.query_blocks + qb) * d.key_blocks + kb;
          const Index count = shown[static_cast<std::size_t>(kb)];
          // A block cut short by the end of the rows or keys is full when every element
          // it holds is shown: the kernels never read past len_q or len_k.
          Block kind = count == 0             ? Block::empty
                       : count == rows * cols ? Block::full
                                              : Block::partial;
          d.kinds[static_cast<std::size_t>(index)] = static_cast<std::uint8_t>(kind);
          if (kind != Block::partial) continue;
          d.partial[static_cast<std::size_t>(index)] = static_cast<std::int32_t>(
              d.bits.size() / static_cast<std::size_t>(block_size * d.words));
          const std::size_t base = d.bits.size();
          d.bits.resize(base + static_cast<std::size_t>(block_size * d.words), 0);
          for (Index r = 0; r < rows; ++r) {
            const std::uint8_t* row = stripe.data() + r * len_k + j0;
            std::uint64_t* words = d.bits.data() + base + r * d.words;
            for (Index c = 0; c < cols; ++c) {
              if (row[c] != 0) words[c / 64] |= std::uint64_t{1} << (c % 64);
            }
          }
        }
      }
    }
  }
  return BlockMask(std::move(data));
}

BlockMask BlockMask::from_dense(const TensorView& mask, Index block_size) {
  const auto view = mask.as<bool>("mask");
  for (int axis = 0; axis < 4; ++axis) check_positive("mask", mask.shape[axis]);
  core::check_storage("mask", mask);
  return from_rows(
      mask.shape[0], mask.shape[1], mask.shape[2], mask.shape[3],
      [&](Index b, Index h, Index i, std::uint8_t* row) {
        const bool* in = view.row(b, h, i);
        for (Index j = 0; j < mask.shape[3]; ++j) row[j] = in[j * view.strides[3]] ? 1 : 0;
      },
      block_size);
}

BlockMask BlockMask::documents(std::span<const std::int64_t> query_documents,
                               std::span<const std::int64_t> key_documents, Index batch,
                               Index block_size) {
  check_positive("batch", batch);
  const auto entries = static_cast<std::size_t>(batch);
  if (query_documents.empty() || query_documents.size() % entries != 0) {
    fail("query_documents",
         "a document id per query of each of " + std::to_string(batch) + " batch entries",
         std::to_string(query_documents.size()) + " ids");
  }
  if (key_documents.empty() || key_documents.size() % entries != 0) {
    fail("key_documents",
         "a document id per key of each of " + std::to_string(batch) + " batch entries",
         std::to_string(key_documents.size()) + " ids");
  }
  const auto len_q = static_cast<Index>(query_documents.size() / entries);
  const auto len_k = static_cast<Index>(key_documents.size() / entries);
  return from_rows(
      batch, 1, len_q, len_k,
      [&](Index b, Index, Index i, std::uint8_t* row) {
        const std::int64_t document = query_documents[static_cast<std::size_t>(b * len_q + i)];
        const std::int64_t* keys = key_documents.data() + b * len_k;
        for (Index j = 0; j < len_k; ++j) row[j] = keys[j] == document ? 1 : 0;
      },
      block_size);
}

BlockMask BlockMask::prefix_lm(std::span<const Index> prefix_lengths, Index len_q, Index len_k,
                               Index block_size) {
  if (prefix_lengths.empty()) fail("prefix_lengths", "one length per batch entry", "none");
  for (const Index prefix : prefix_lengths) {
    if (prefix < 0) fail("prefix_lengths", "lengths of at least 0", std::to_string(prefix));
  }
  return from_rows(
      static_cast<Index>(prefix_lengths.size()), 1, len_q, len_k,
      [&](Index b, Index, Index i, std::uint8_t* row) {
        const Index prefix = prefix_lengths[static_cast<std::size_t>(b)];
        for (Index j = 0; j < len_k; ++j) row[j] = j < prefix || j <= i ? 1 : 0;
      },
      block_size);
}

BlockMask BlockMask::chunked(Index chunk, Index len_q, Index len_k, Index block_size) {
  check_positive("chunk", chunk);
  return from_rows(
      1, 1, len_q, len_k,
      [&](Index, Index, Index i, std::uint8_t* row) {
        for (Index j = 0; j < len_k; ++j) row[j] = i / chunk == j / chunk ? 1 : 0;
      },
      block_size);
}

BlockMask BlockMask::window_and_global(Index window, std::span<const Index> global_tokens,
                                       Index len_q, Index len_k, Index block_size) {
  if (window < 0) fail("window", "a window of at least 0", std::to_string(window));
  std::vector<std::uint8_t> global_key(static_cast<std::size_t>(std::max<Index>(len_k, 0)));
  std::vector<std::uint8_t> global_query(static_cast<std::size_t>(std::max<Index>(len_q, 0)));
  for (const Index token : global_tokens) {
    if (token < 0 || token >= std::max(len_q, len_k)) {
      fail("global_tokens", "positions in [0, " + std::to_string(std::max(len_q, len_k)) + ")",
           std::to_string(token));
    }
    if (token < len_k) global_key[static_cast<std::size_t>(token)] = 1;
    if (token < len_q) global_query[static_cast<std::size_t>(token)] = 1;
  }
  return from_rows(
      1, 1, len_q, len_k,
      [&](Index, Index, Index i, std::uint8_t* row) {
        const bool global = global_query[static_cast<std::size_t>(i)] != 0;
        for (Index j = 0; j < len_k; ++j) {
          row[j] =
              global || global_key[static_cast<std::size_t>(j)] != 0 || std::abs(i - j) <= window
                  ? 1
                  : 0;
        }
      },
      block_size);
}

bool BlockMask::shows(Index b, Index h, Index i, Index j) const {
  const Index bs = data_->block_size;
  switch (block(b, h, i / bs, j / bs)) {
    case Block::empty:
      return false;
    case Block::full:
      return true;
    case Block::partial:
      break;
  }
  return row_shows(partial_row(b, h, i, j / bs), j % bs);
}

Index BlockMask::count(Block kind) const {
  return static_cast<Index>(
      std::count(data_->kinds.begin(), data_->kinds.end(), static_cast<std::uint8_t>(kind)));
}

double BlockMask::visible_fraction() const {
  return 1.0 - static_cast<double>(count(Block::empty)) / static_cast<double>(data_->kinds.size());
}

std::size_t BlockMask::bytes() const {
  const Data& d = *data_;
  return d.kinds.size() * sizeof(std::uint8_t) + d.partial.size() * sizeof(std::int32_t) +
         d.bits.size() * sizeof(std::uint64_t);
}

Tensor BlockMask::to_dense() const {
  const Data& d = *data_;
  Tensor out(DType::boolean, {d.batch, d.heads, d.len_q, d.len_k});
  bool* flags = out.data_as<bool>();
  for (Index b = 0; b < d.batch; ++b)
    for (Index h = 0; h < d.heads; ++h)
      for (Index i = 0; i < d.len_q; ++i)
        for (Index j = 0; j < d.len_k; ++j) *flags++ = shows(b, h, i, j);
  return out;
}

}  // namespace attn
