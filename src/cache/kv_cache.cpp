// attn::KVCache bookkeeping (block pool, free list, reference counts, copy-on-write) and
// the conversion of appended rows to the cache dtype.
#include "attn/kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "cache/kv_cache_blocks.hpp"
#include "core/argument_checks.hpp"
#include "core/rows.hpp"

namespace attn {
namespace {

using core::fail;

DType storage_dtype(CacheDType dtype) {
  switch (dtype) {
    case CacheDType::f16:
      return DType::f16;
    case CacheDType::bf16:
      return DType::bf16;
    case CacheDType::f32:
    case CacheDType::int8:
      return DType::f32;
  }
  return DType::f32;
}

void check_rows(const char* name, const TensorView& t, Index heads, Index dim, Index tokens) {
  const std::string expected = "shape [1, " + std::to_string(heads) + ", n, " +
                               std::to_string(dim) + "]" +
                               (tokens >= 0 ? " with n = " + std::to_string(tokens) : "");
  if (t.shape[0] != 1 || t.shape[1] != heads || t.shape[2] < 0 || t.shape[3] != dim ||
      (tokens >= 0 && t.shape[2] != tokens)) {
    fail(name, expected, format_dims(t.shape));
  }
  core::check_float_dtype(name, t.dtype);
  core::check_storage(name, t);
}

}  // namespace

KVCache::Blocks::Blocks(const KVCacheConfig& config)
    : heads_kv(config.heads_kv),
      page_size(config.page_size),
      dim(config.dim),
      dim_v(config.dim_v),
      int8(config.dtype == CacheDType::int8),
      element_size(int8 ? 1 : dtype_size(storage_dtype(config.dtype))),
      key_block_bytes(static_cast<std::size_t>(heads_kv * page_size * dim) * element_size),
      value_block_bytes(static_cast<std::size_t>(heads_kv * page_size * dim_v) * element_size) {}

void KVCache::Blocks::add() {
  key_pool.resize(key_pool.size() + key_block_bytes);
  value_pool.resize(value_pool.size() + value_block_bytes);
  if (int8) {
    key_scales.resize(key_scales.size() + static_cast<std::size_t>(heads_kv));
    value_scales.resize(value_scales.size() + static_cast<std::size_t>(heads_kv));
  }
}

void KVCache::Blocks::copy(std::int32_t from, std::int32_t to) {
  const auto f = static_cast<std::size_t>(from), t = static_cast<std::size_t>(to);
  std::memcpy(key_pool.data() + t * key_block_bytes, key_pool.data() + f * key_block_bytes,
              key_block_bytes);
  std::memcpy(value_pool.data() + t * value_block_bytes, value_pool.data() + f * value_block_bytes,
              value_block_bytes);
  if (int8) {
    const auto heads = static_cast<std::size_t>(heads_kv);
    std::copy_n(key_scales.begin() + static_cast<std::ptrdiff_t>(f * heads), heads,
                key_scales.begin() + static_cast<std::ptrdiff_t>(t * heads));
    std::copy_n(value_scales.begin() + static_cast<std::ptrdiff_t>(f * heads), heads,
                value_scales.begin() + static_cast<std::ptrdiff_t>(t * heads));
  }
}

const char* cache_dtype_name(CacheDType dtype) {
  switch (dtype) {
    case CacheDType::f32:
      return "float32";
    case CacheDType::f16:
      return "float16";
    case CacheDType::bf16:
      return "bfloat16";
    case CacheDType::int8:
      return "int8";
  }
  return "unknown";
}

KVCache::KVCache(const KVCacheConfig& config) : config_(config) {
  const auto positive = [](const char* name, Index value) {
    if (value < 1) fail(name, "a positive count", std::to_string(value));
  };
  positive("heads_kv", config.heads_kv);
  positive("dim", config.dim);
  positive("dim_v", config.dim_v);
  positive("page_size", config.page_size);
  if (config.max_blocks < 0 || config.max_blocks > std::numeric_limits<std::int32_t>::max()) {
    fail("max_blocks", "0 (grow as needed) or a positive count below 2^31",
         std::to_string(config.max_blocks));
  }
  blocks_ = std::make_unique<Blocks>(config);
}

KVCache::KVCache(const KVCache& other)
    : config_(other.config_),
      blocks_(std::make_unique<Blocks>(*other.blocks_)),
      ref_counts_(other.ref_counts_),
      free_blocks_(other.free_blocks_),
      sequences_(other.sequences_),
      next_id_(other.next_id_) {}

KVCache& KVCache::operator=(const KVCache& other) {
  if (this != &other) *this = KVCache(other);
  return *this;
}

KVCache::KVCache(KVCache&& other) noexcept = default;
KVCache& KVCache::operator=(KVCache&& other) noexcept = default;
KVCache::~KVCache() = default;

const KVCache::Sequence& KVCache::sequence(SequenceId seq, const char* argument) const {
  const auto found = sequences_.find(seq);
  if (found == sequences_.end()) {
    fail(argument, "the id of a sequence in the cache", std::to_string(seq));
  }
  return found->second;
}

KVCache::SequenceId KVCache::add_sequence() {
  sequences_.emplace(next_id_, Sequence{});
  return next_id_++;
}

KVCache::SequenceId KVCache::fork(SequenceId parent) {
  Sequence child = sequence(parent, "parent");
  for (const std::int32_t block : child.blocks) ++ref_counts_[static_cast<std::size_t>(block)];
  sequences_.emplace(next_id_, std::move(child));
  return next_id_++;
}

void KVCache::drop(SequenceId seq) {
  const Sequence& s = sequence(seq, "seq");
  for (const std::int32_t block : s.blocks) release_block(block);
  sequences_.erase(seq);
}

Index KVCache::length(SequenceId seq) const {
  return sequence(seq, "seq").length;
}

std::vector<KVCache::SequenceId> KVCache::sequence_ids() const {
  std::vector<SequenceId> ids;
  for (const auto& entry : sequences_) ids.push_back(entry.first);
  return ids;
}

const std::vector<std::int32_t>& KVCache::block_table(SequenceId seq) const {
  return sequence(seq, "seq").blocks;
}

std::int32_t KVCache::ref_count(std::int32_t block) const {
  if (block < 0 || block >= blocks_allocated()) {
    fail("block", "an index below " + std::to_string(blocks_allocated()), std::to_string(block));
  }
  return ref_counts_[static_cast<std::size_t>(block)];
}

std::int32_t KVCache::take_block() {
  if (!free_blocks_.empty()) {
    const std::int32_t block = free_blocks_.back();
    free_blocks_.pop_back();
    ref_counts_[static_cast<std::size_t>(block)] = 1;
    return block;
  }
  const auto block = static_cast<std::int32_t>(ref_counts_.size());
  ref_counts_.push_back(1);
  blocks_->add();
  return block;
}

void KVCache::release_block(std::int32_t block) {
  if (--ref_counts_[static_cast<std::size_t>(block)] == 0) free_blocks_.push_back(block);
}

void KVCache::append(SequenceId seq, const TensorView& k, const TensorView& v) {
  const Sequence& current = sequence(seq, "seq");
  check_rows("k", k, config_.heads_kv, config_.dim, -1);
  check_rows("v", v, config_.heads_kv, config_.dim_v, k.shape[2]);
  const Index count = k.shape[2], page = config_.page_size;
  if (count == 0) return;
  if (config_.dtype == CacheDType::int8) {
    // A non-finite value has no int8 scale; refuse it before anything is written.
    for (const TensorView* t : {&k, &v}) {
      std::vector<double> row(static_cast<std::size_t>(t->shape[3]));
      for (Index h = 0; h < config_.heads_kv; ++h)
        for (Index i = 0; i < count; ++i) {
          core::load_row(*t, 0, h, i, row.data());
          for (const double x : row) {
            if (!std::isfinite(x)) {
              fail(t == &k ? "k" : "v", "finite values for an int8 cache",
                   std::to_string(x) + " at head " + std::to_string(h) + ", token " +
                       std::to_string(i));
            }
          }
        }
    }
  }
  const Index slot = current.length % page;
  const bool shared_tail = slot != 0 && ref_count(current.blocks.back()) > 1;
  const Index new_blocks = (current.length + count + page - 1) / page -
                           static_cast<Index>(current.blocks.size()) + (shared_tail ? 1 : 0);
  if (config_.max_blocks > 0 && blocks_in_use() + new_blocks > config_.max_blocks) {
    fail("k",
         "at most " + std::to_string(config_.max_blocks - blocks_in_use()) + " more blocks of " +
             std::to_string(page) + " tokens (max_blocks)",
         std::to_string(count) + " tokens needing " + std::to_string(new_blocks));
  }
  Sequence& s = sequences_.at(seq);
  if (shared_tail) {
    // Copy-on-write: other sequences keep reading the shared block as it was.
    const std::int32_t copy = take_block();
    blocks_->copy(s.blocks.back(), copy);
    release_block(s.blocks.back());
    s.blocks.back() = copy;
  }
  Index done = 0;
  while (done < count) {
    const Index at = (s.length + done) % page;
    if (at == 0) s.blocks.push_back(take_block());
    const Index rows = std::min(count - done, page - at);
    write_rows(s.blocks.back(), at, k, v, done, rows);
    done += rows;
  }
  s.length += count;
}

// Writes tokens [first, first + count) of k and v into slots [slot, slot + count) of block.
void KVCache::write_rows(std::int32_t block, Index slot, const TensorView& k, const TensorView& v,
                         Index first, Index count) {
  for (const bool is_value : {false, true}) {
    const TensorView& in = is_value ? v : k;
    const Index dim = in.shape[3];
    std::vector<double> row(static_cast<std::size_t>(dim));
    for (Index h = 0; h < config_.heads_kv; ++h) {
      std::byte* base = blocks_->rows(block, h, is_value);
      if (config_.dtype != CacheDType::int8) {
        const DType dtype = storage_dtype(config_.dtype);
        const MutableTensorView rows(base, dtype, {1, 1, config_.page_size, dim});
        if (in.dtype == dtype) {
          // Same dtype: the bits go in unchanged.
          const std::size_t row_bytes = static_cast<std::size_t>(dim) * dtype_size(dtype);
          for (Index i = 0; i < count; ++i) {
            const auto* from =
                static_cast<const std::byte*>(in.data) +
                static_cast<std::size_t>(h * in.strides[1] + (first + i) * in.strides[2]) *
                    dtype_size(dtype);
            std::memcpy(base + static_cast<std::size_t>(slot + i) * row_bytes, from, row_bytes);
          }
          continue;
        }
        for (Index i = 0; i < count; ++i) {
          core::load_row(in, 0, h, first + i, row.data());
          core::store_row(rows, 0, 0, slot + i, row.data());
        }
        continue;
      }
      auto* q = reinterpret_cast<std::int8_t*>(base);
      float& scale = blocks_->scale(block, h, is_value);
      if (slot == 0) scale = 0.0f;
      double largest = 0.0;
      for (Index i = 0; i < count; ++i) {
        core::load_row(in, 0, h, first + i, row.data());
        for (const double x : row) largest = std::max(largest, std::abs(x));
      }
      const auto needed = static_cast<float>(largest / 127.0);
      if (needed > scale) {
        // Requantise the block's earlier tokens of this head to the larger scale.
        const double ratio = scale / static_cast<double>(needed);
        for (Index e = 0; e < slot * dim; ++e) {
          q[e] = static_cast<std::int8_t>(std::lround(q[e] * ratio));
        }
        scale = needed;
      }
      for (Index i = 0; i < count; ++i) {
        core::load_row(in, 0, h, first + i, row.data());
        std::int8_t* out = q + (slot + i) * dim;
        for (Index d = 0; d < dim; ++d) {
          const double x = scale > 0.0f ? row[static_cast<std::size_t>(d)] / scale : 0.0;
          out[d] = static_cast<std::int8_t>(std::clamp<long>(std::lround(x), -127, 127));
        }
      }
    }
  }
}

Tensor KVCache::dequantise(SequenceId seq, bool values) const {
  const Sequence& s = sequence(seq, "seq");
  const Index dim = values ? config_.dim_v : config_.dim, page = config_.page_size;
  Tensor out(DType::f32, {1, config_.heads_kv, s.length, dim});
  float* to = out.data_as<float>();
  std::vector<double> row(static_cast<std::size_t>(dim));
  for (Index h = 0; h < config_.heads_kv; ++h)
    for (Index t = 0; t < s.length; ++t) {
      const std::int32_t block = s.blocks[static_cast<std::size_t>(t / page)];
      const std::byte* base = blocks_->rows(block, h, values);
      float* dst = to + (h * s.length + t) * dim;
      if (config_.dtype == CacheDType::int8) {
        const auto* q = reinterpret_cast<const std::int8_t*>(base) + (t % page) * dim;
        const float scale = blocks_->scale(block, h, values);
        for (Index d = 0; d < dim; ++d) dst[d] = static_cast<float>(q[d]) * scale;
        continue;
      }
      const TensorView rows(base, storage_dtype(config_.dtype), {1, 1, page, dim});
      core::load_row(rows, 0, 0, t % page, row.data());
      for (Index d = 0; d < dim; ++d) dst[d] = static_cast<float>(row[static_cast<std::size_t>(d)]);
    }
  return out;
}

Tensor KVCache::keys(SequenceId seq) const {
  return dequantise(seq, false);
}

Tensor KVCache::values(SequenceId seq) const {
  return dequantise(seq, true);
}

}  // namespace attn
