// attn::BlockMask: a boolean attention pattern stored by blocks of block_size x block_size
// (query rows x keys), each empty (every key hidden), full (every key shown) or partial
// (its own bits), as FlexAttention's BlockMask. Built once, from a dense boolean mask, a
// predicate over (batch, head, query, key) or one of the patterns below, and reused across
// calls, layers and heads (batch and heads of 1 broadcast). Given as Options::block_mask,
// the kernels skip empty blocks, do no masking work on full ones and read bits only for
// partial ones; no Lq x Lk array is held. Its rows and keys are a segment's own: with
// packed sequences (cu_seqlens), batch entry s of the mask is sequence s, from its first
// query and key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

class BlockMask {
 public:
  enum class Block : std::uint8_t { empty, full, partial };
  // FlexAttention's default, and the forward kernel's key tile.
  static constexpr Index kDefaultBlockSize = 128;
  // Block sizes are powers of two from 16 to 1024.
  static constexpr Index kMinBlockSize = 16, kMaxBlockSize = 1024;

  // fill(b, h, i, row) writes query i's row of len_k flags (non-zero: may attend) for batch
  // entry b and head h; it is called once per row, a query block at a time (the rows of
  // block qb for every b and h before those of block qb + 1).
  using RowFill = std::function<void(Index b, Index h, Index i, std::uint8_t* row)>;

  // Throws attn::Error naming the argument: sizes not positive, block_size not a power of
  // two in [16, 1024].
  static BlockMask from_rows(Index batch, Index heads, Index len_q, Index len_k,
                             const RowFill& fill, Index block_size = kDefaultBlockSize);
  // mask: boolean [B, H, Lq, Lk] (B or H of 1 broadcast), true where a query may attend.
  static BlockMask from_dense(const TensorView& mask, Index block_size = kDefaultBlockSize);
  // predicate(b, h, i, j) -> bool, evaluated once per element.
  template <class Predicate>
  static BlockMask from_predicate(Index batch, Index heads, Index len_q, Index len_k,
                                  const Predicate& predicate,
                                  Index block_size = kDefaultBlockSize) {
    return from_rows(
        batch, heads, len_q, len_k,
        [&](Index b, Index h, Index i, std::uint8_t* row) {
          for (Index j = 0; j < len_k; ++j) row[j] = predicate(b, h, i, j) ? 1 : 0;
        },
        block_size);
  }

  // Documents of a packed batch: query i sees key j when they belong to the same document.
  // query_documents [batch * len_q], key_documents [batch * len_k]: a document id per
  // position, batch entry by batch entry (add causal in Options for causal documents).
  static BlockMask documents(std::span<const std::int64_t> query_documents,
                             std::span<const std::int64_t> key_documents, Index batch = 1,
                             Index block_size = kDefaultBlockSize);
  // Prefix-LM: every query sees the first prefix_lengths[b] keys, and after them the keys
  // j <= i (bidirectional over the prefix, causal after it). prefix_lengths: [batch].
  static BlockMask prefix_lm(std::span<const Index> prefix_lengths, Index len_q, Index len_k,
                             Index block_size = kDefaultBlockSize);
  // Chunked local attention (Llama 4): query i sees key j when i / chunk == j / chunk
  // (add causal in Options for causal chunks).
  static BlockMask chunked(Index chunk, Index len_q, Index len_k,
                           Index block_size = kDefaultBlockSize);
  // A sliding window with global tokens (Longformer): query i sees key j when
  // |i - j| <= window, or when i or j is one of global_tokens.
  static BlockMask window_and_global(Index window, std::span<const Index> global_tokens,
                                     Index len_q, Index len_k,
                                     Index block_size = kDefaultBlockSize);

  Index batch() const { return data_->batch; }
  Index heads() const { return data_->heads; }
  Index len_q() const { return data_->len_q; }
  Index len_k() const { return data_->len_k; }
  Index block_size() const { return data_->block_size; }
  Index query_blocks() const { return data_->query_blocks; }
  Index key_blocks() const { return data_->key_blocks; }

  // Block (qb, kb) of batch entry b and head h (a mask of batch or heads 1 broadcasts).
  Block block(Index b, Index h, Index qb, Index kb) const {
    return static_cast<Block>(data_->kinds[static_cast<std::size_t>(block_index(b, h, qb, kb))]);
  }
  // Whether query i may attend to key j.
  bool shows(Index b, Index h, Index i, Index j) const;
  // The bits of query i's row in its partial block (qb = i / block_size, kb): key j is bit
  // c % 64 of word c / 64, for c = j % block_size.
  const std::uint64_t* partial_row(Index b, Index h, Index i, Index kb) const {
    const Index bs = data_->block_size;
    const std::int32_t partial =
        data_->partial[static_cast<std::size_t>(block_index(b, h, i / bs, kb))];
    return data_->bits.data() + (static_cast<Index>(partial) * bs + i % bs) * data_->words;
  }
  // Whether a partial row shows its key c (= j % block_size).
  static bool row_shows(const std::uint64_t* row, Index c) {
    return (row[c / 64] >> (c % 64) & 1) != 0;
  }
  // Blocks of each kind, over every (batch entry, head) the mask stores.
  Index count(Block kind) const;
  // The share of blocks that are not empty.
  double visible_fraction() const;
  // Bytes the mask holds: a kind and an index per block, and the partial blocks' bits.
  std::size_t bytes() const;
  // The mask as boolean [batch, heads, len_q, len_k].
  Tensor to_dense() const;

 private:
  struct Data {
    Index batch = 0, heads = 0, len_q = 0, len_k = 0, block_size = 0;
    Index query_blocks = 0, key_blocks = 0, words = 0;  // words: 64-bit words of a block row
    std::vector<std::uint8_t> kinds;    // [batch][heads][query_blocks][key_blocks]: Block
    std::vector<std::int32_t> partial;  // the same: a partial block's index into bits
    std::vector<std::uint64_t> bits;    // [partial blocks][block_size][words]
  };

  explicit BlockMask(std::shared_ptr<const Data> data) : data_(std::move(data)) {}

  Index block_index(Index b, Index h, Index qb, Index kb) const {
    const Data& d = *data_;
    const Index bb = d.batch == 1 ? 0 : b, hh = d.heads == 1 ? 0 : h;
    return ((bb * d.heads + hh) * d.query_blocks + qb) * d.key_blocks + kb;
  }

  std::shared_ptr<const Data> data_;  // shared by copies: a mask is immutable once built
};

}  // namespace attn
