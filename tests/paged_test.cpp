// attn::paged_attention over pools the test owns: against the float64 reference for every
// layout, storage dtype, page size (1, 16, 256) and option, over ragged batches (no query,
// one, a prefill run, more queries than keys, an empty sequence), non-monotone tables and
// shared pages; batch invariance bitwise on every target (alone or with others, in any
// order, any thread count, page size and layout, chunked prefill against one shot, the
// KVCache's decode); bad batches refused naming the argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "attn/paged.hpp"
#include "core/float8.hpp"
#include "core/int4.hpp"
#include "cpu/bf16_dot.hpp"
#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/error_message.hpp"
#include "support/targets.hpp"

namespace attn::testing {
namespace {

struct Sequence {
  Index length = 0, queries = 0;
};

struct Shape {
  Index heads_q = 4, heads_kv = 2, dim = 40, dim_v = 24;
  std::vector<Sequence> sequences;
  // The second sequence reads the first one's pages for the keys they both hold, in whole
  // pages (a forked prompt).
  bool share_prefix = false;
};

struct Storage {
  CacheDType dtype = CacheDType::f32;
  Index page = 16;
  PageLayout layout = PageLayout::token_major;
  bool varied_scales = true;  // int8: a random scale per token and head, else one for all
  Index group = 0;            // int8: elements per scale (0: the whole row)
  bool head_scales = false;   // fp8: a random scale per KV head in each pool
  bool zero_point = false;    // int8, int4: a random offset beside each scale
  // The values' dtype where it is not the keys' (group, head_scales and zero_point apply to
  // each side whose dtype takes them).
  std::optional<CacheDType> value_dtype = std::nullopt;

  CacheDType dtype_of(bool values) const { return values && value_dtype ? *value_dtype : dtype; }
};

constexpr CacheDType kCacheDTypes[] = {CacheDType::f32,      CacheDType::f16,
                                       CacheDType::bf16,     CacheDType::int8,
                                       CacheDType::fp8_e4m3, CacheDType::fp8_e5m2};

std::size_t bytes_of(CacheDType dtype) {
  return dtype == CacheDType::f32                                ? 4
         : dtype == CacheDType::f16 || dtype == CacheDType::bf16 ? 2
                                                                 : 1;
}

// Bytes of a row of dim elements (int4: two a byte).
std::size_t row_bytes_of(CacheDType dtype, Index dim) {
  return dtype == CacheDType::int4 ? static_cast<std::size_t>(dim / 2)
                                   : static_cast<std::size_t>(dim) * bytes_of(dtype);
}

bool has_scales(CacheDType dtype) {
  return dtype == CacheDType::int8 || dtype == CacheDType::int4;
}

bool is_fp8(CacheDType dtype) {
  return dtype == CacheDType::fp8_e4m3 || dtype == CacheDType::fp8_e5m2;
}

// The codes of int8 and int4 tokens are multiples of this (their scales near it).
float unit_of(CacheDType dtype) {
  return dtype == CacheDType::int4 ? 1.0f / 4.0f : 1.0f / 40.0f;
}

// Token values each storage holds exactly: for int8 and int4, integer codes (times the
// scale).
float representable(float x, CacheDType dtype) {
  switch (dtype) {
    case CacheDType::f32:
      return x;
    case CacheDType::f16:
      return to_float(to_float16(x));
    case CacheDType::bf16:
      return to_float(to_bfloat16(x));
    case CacheDType::int8:
      return std::clamp(std::round(x * 40.0f), -127.0f, 127.0f);
    case CacheDType::int4:
      return std::clamp(std::round(x * 4.0f), -8.0f, 7.0f);
    case CacheDType::fp8_e4m3:
      return to_float(to_float8_e4m3(x));
    case CacheDType::fp8_e5m2:
      return to_float(to_float8_e5m2(x));
  }
  return x;
}

// The tokens of every sequence (per sequence [Hkv][length][dim] codes), made once for a
// shape so that pools of any page size and layout can hold the same keys and values.
struct Tokens {
  std::vector<std::vector<float>> keys, values;
  Tensor q;                    // [1, total_q, Hq, dim] float32, values q_dtype holds exactly
  DType q_dtype = DType::f32;  // the dtype the kernel is given q in (f32 or bf16)
};

// q (float32) in `dtype` (float32 or bfloat16, which holds its values exactly).
Tensor queries_in(const Tensor& q, DType dtype) {
  Tensor out(dtype, q.shape());
  for (Index i = 0; i < q.numel(); ++i) {
    const float x = q.data_as<float>()[i];
    if (dtype == DType::bf16) {
      out.data_as<bfloat16>()[i] = to_bfloat16(x);
    } else {
      out.data_as<float>()[i] = x;
    }
  }
  return out;
}

// Keys that key_dtype holds and values that value_dtype holds.
Tokens make_tokens(const Shape& shape, CacheDType key_dtype, CacheDType value_dtype, unsigned seed,
                   DType q_dtype = DType::f32) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tokens t;
  for (std::size_t s = 0; s < shape.sequences.size(); ++s) {
    const Index length = shape.sequences[s].length;
    for (auto* side : {&t.keys, &t.values}) {
      const Index dim = side == &t.keys ? shape.dim : shape.dim_v;
      const CacheDType dtype = side == &t.keys ? key_dtype : value_dtype;
      std::vector<float> codes(static_cast<std::size_t>(shape.heads_kv * length * dim));
      for (float& c : codes) c = representable(normal(rng), dtype);
      side->push_back(std::move(codes));
    }
  }
  if (shape.share_prefix) {
    const Index shared = std::min(shape.sequences[0].length, shape.sequences[1].length);
    for (auto* side : {&t.keys, &t.values}) {
      const Index dim = side == &t.keys ? shape.dim : shape.dim_v;
      for (Index h = 0; h < shape.heads_kv; ++h) {
        std::copy_n((*side)[0].begin() + h * shape.sequences[0].length * dim, shared * dim,
                    (*side)[1].begin() + h * shape.sequences[1].length * dim);
      }
    }
  }
  Index total = 0;
  for (const Sequence& s : shape.sequences) total += s.queries;
  t.q = Tensor(DType::f32, {1, total, shape.heads_q, shape.dim});
  t.q_dtype = q_dtype;
  for (Index i = 0; i < t.q.numel(); ++i) {
    const float x = normal(rng);
    t.q.data_as<float>()[i] = q_dtype == DType::bf16 ? representable(x, CacheDType::bf16) : x;
  }
  return t;
}

Tokens make_tokens(const Shape& shape, CacheDType dtype, unsigned seed,
                   DType q_dtype = DType::f32) {
  return make_tokens(shape, dtype, dtype, seed, q_dtype);
}

// Pools holding the tokens, pages handed out in a shuffled order (so tables are not
// monotone) with spare pages between, and the batch's int32 arrays.
struct Paged {
  Shape shape;
  Storage storage;
  std::vector<std::byte> key_bytes, value_bytes;
  std::vector<float> key_scales, value_scales;
  std::vector<std::int32_t> query_start, seq_lens, table;
  Index pages = 0, max_pages = 0;

  PagePool pool(bool values) {
    PagePool p;
    p.data = values ? value_bytes.data() : key_bytes.data();
    p.dtype = storage.dtype_of(values);
    p.layout = storage.layout;
    p.pages = pages;
    p.page_size = storage.page;
    p.heads_kv = shape.heads_kv;
    p.dim = values ? shape.dim_v : shape.dim;
    if (has_scales(p.dtype)) {
      p.scales = values ? value_scales.data() : key_scales.data();
      p.group = storage.group;
      p.zero_point = storage.zero_point;
    }
    if (head_scaled(values)) p.scales = values ? value_scales.data() : key_scales.data();
    return p;
  }
  // int8 and int4 scales per row of the keys or values, and floats of them (with offsets).
  Index groups(bool values) const {
    return storage.group > 0 ? (values ? shape.dim_v : shape.dim) / storage.group : 1;
  }
  Index row_scales(bool values) const { return groups(values) * (storage.zero_point ? 2 : 1); }
  // Code times its scale; with zero points, plus its offset, rounded to float32 once (the
  // value the format defines).
  double scaled_code(bool values, Index page_index, Index slot, Index head, Index d,
                     int code) const {
    const Index g = storage.group > 0 ? d / storage.group : 0;
    const float* scales = (values ? value_scales : key_scales).data() +
                          row_of(page_index, slot, head) * row_scales(values);
    if (!storage.zero_point) return code * static_cast<double>(scales[g]);
    return std::fma(static_cast<float>(code), scales[2 * g], scales[2 * g + 1]);
  }
  PagedBatch batch() const { return {query_start, seq_lens, table, max_pages}; }
  // The row of (page, slot, head) in the pool's layout: of its scale, and times the row's
  // bytes, of its element 0.
  Index row_of(Index page_index, Index slot, Index head) const {
    const Index page = storage.page, heads = shape.heads_kv;
    return storage.layout == PageLayout::token_major ? (page_index * page + slot) * heads + head
                                                     : (page_index * heads + head) * page + slot;
  }
  // Byte offset of (page, slot, head, element 0) in the key or value pool.
  std::size_t offset(bool values, Index page_index, Index slot, Index head) const {
    return static_cast<std::size_t>(row_of(page_index, slot, head)) *
           row_bytes_of(storage.dtype_of(values), values ? shape.dim_v : shape.dim);
  }
  // An fp8 pool with a scale per KV head.
  bool head_scaled(bool values) const {
    return storage.head_scales && is_fp8(storage.dtype_of(values));
  }
  // An fp8 pool's scale of a KV head: 1 without head_scales.
  double head_scale(bool values, Index head) const {
    if (!head_scaled(values)) return 1.0;
    return (values ? value_scales : key_scales)[static_cast<std::size_t>(head)];
  }
  // The dequantised element of sequence s's token t.
  double element(bool values, Index s, Index head, Index t, Index d) const {
    const Index page_index = table[static_cast<std::size_t>(s * max_pages + t / storage.page)];
    const std::byte* at = (values ? value_bytes : key_bytes).data() +
                          offset(values, page_index, t % storage.page, head);
    switch (storage.dtype_of(values)) {
      case CacheDType::f32:
        return reinterpret_cast<const float*>(at)[d];
      case CacheDType::f16:
        return to_float(reinterpret_cast<const float16*>(at)[d]);
      case CacheDType::bf16:
        return to_float(reinterpret_cast<const bfloat16*>(at)[d]);
      case CacheDType::int8:
        return scaled_code(values, page_index, t % storage.page, head, d,
                           reinterpret_cast<const std::int8_t*>(at)[d]);
      case CacheDType::fp8_e4m3:
        return to_float(reinterpret_cast<const float8_e4m3*>(at)[d]) * head_scale(values, head);
      case CacheDType::fp8_e5m2:
        return to_float(reinterpret_cast<const float8_e5m2*>(at)[d]) * head_scale(values, head);
      case CacheDType::int4:
        return scaled_code(values, page_index, t % storage.page, head, d,
                           int4_code(reinterpret_cast<const Int4Pair*>(at), d));
    }
    return 0.0;
  }
};

void store(std::byte* at, float code, CacheDType dtype) {
  switch (dtype) {
    case CacheDType::f32:
      std::memcpy(at, &code, 4);
      return;
    case CacheDType::f16: {
      const float16 h = to_float16(code);
      std::memcpy(at, &h, 2);
      return;
    }
    case CacheDType::bf16: {
      const bfloat16 h = to_bfloat16(code);
      std::memcpy(at, &h, 2);
      return;
    }
    case CacheDType::int8: {
      const auto i = static_cast<std::int8_t>(code);
      std::memcpy(at, &i, 1);
      return;
    }
    case CacheDType::fp8_e4m3:
      *reinterpret_cast<std::uint8_t*>(at) = to_float8_e4m3(code).bits;
      return;
    case CacheDType::fp8_e5m2:
      *reinterpret_cast<std::uint8_t*>(at) = to_float8_e5m2(code).bits;
      return;
    case CacheDType::int4:  // two a byte: make_paged writes them
      return;
  }
}

Paged make_paged(const Shape& shape, const Storage& storage, const Tokens& tokens, unsigned seed) {
  std::mt19937_64 rng(seed);
  Paged p;
  p.shape = shape;
  p.storage = storage;
  const Index page = storage.page;
  std::vector<Index> pages_of;
  for (const Sequence& s : shape.sequences) {
    pages_of.push_back((s.length + page - 1) / page);
    p.max_pages = std::max(p.max_pages, pages_of.back() + 1);  // one entry past the end unused
  }
  const Index needed = std::accumulate(pages_of.begin(), pages_of.end(), Index{0});
  p.pages = needed + 3;
  std::vector<std::int32_t> order(static_cast<std::size_t>(p.pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const auto sequences = static_cast<Index>(shape.sequences.size());
  p.table.assign(static_cast<std::size_t>(sequences * p.max_pages), -1);
  std::size_t next = 0;
  for (Index s = 0; s < sequences; ++s) {
    for (Index j = 0; j < pages_of[s]; ++j) p.table[s * p.max_pages + j] = order[next++];
  }
  if (shape.share_prefix) {
    const Index shared = std::min(shape.sequences[0].length, shape.sequences[1].length) / page;
    for (Index j = 0; j < shared; ++j) p.table[p.max_pages + j] = p.table[j];
  }
  p.query_start.push_back(0);
  for (const Sequence& s : shape.sequences) {
    p.query_start.push_back(p.query_start.back() + static_cast<std::int32_t>(s.queries));
    p.seq_lens.push_back(static_cast<std::int32_t>(s.length));
  }
  for (const bool values : {false, true}) {
    const Index dim = values ? shape.dim_v : shape.dim;
    const CacheDType dtype = storage.dtype_of(values);
    auto& bytes = values ? p.value_bytes : p.key_bytes;
    bytes.assign(
        static_cast<std::size_t>(p.pages * page * shape.heads_kv) * row_bytes_of(dtype, dim),
        std::byte{0x7f});
    if (has_scales(dtype)) {
      auto& scales = values ? p.value_scales : p.key_scales;
      std::uniform_real_distribution<float> spread(0.5f, 2.0f);
      std::uniform_real_distribution<float> offsets(-1.0f, 1.0f);
      scales.resize(
          static_cast<std::size_t>(p.pages * page * shape.heads_kv * p.row_scales(values)));
      for (std::size_t i = 0; i < scales.size(); ++i) {
        scales[i] = storage.zero_point && i % 2 == 1
                        ? offsets(rng)
                        : (storage.varied_scales ? spread(rng) : 1.0f) * unit_of(dtype);
      }
    }
    if (p.head_scaled(values)) {
      auto& scales = values ? p.value_scales : p.key_scales;
      std::uniform_real_distribution<float> spread(0.01f, 4.0f);
      scales.resize(static_cast<std::size_t>(shape.heads_kv));
      for (float& scale : scales) scale = spread(rng);
    }
    for (Index s = 0; s < sequences; ++s) {
      const Index length = shape.sequences[s].length;
      const auto& codes = (values ? tokens.values : tokens.keys)[static_cast<std::size_t>(s)];
      for (Index h = 0; h < shape.heads_kv; ++h)
        for (Index t = 0; t < length; ++t) {
          const Index page_index = p.table[s * p.max_pages + t / page];
          std::byte* at = bytes.data() + p.offset(values, page_index, t % page, h);
          for (Index d = 0; d < dim; ++d) {
            const float code = codes[(h * length + t) * dim + d];
            if (dtype == CacheDType::int4) {
              set_int4_code(reinterpret_cast<Int4Pair*>(at), d, static_cast<int>(code));
            } else {
              store(at + d * bytes_of(dtype), code, dtype);
            }
          }
        }
    }
  }
  return p;
}

PagedOutput run(Paged& p, const Tokens& tokens, const Options& options) {
  return paged_attention(queries_in(tokens.q, tokens.q_dtype).view(), p.pool(false), p.pool(true),
                         p.batch(), options);
}

// Sequence s's rows of an output [1, total_q, Hq, d] as [1, Hq, n_q, d] float64.
Tensor rows_of_sequence(const Tensor& out, Index first, Index count) {
  const Dims& shape = out.shape();
  Tensor t(DType::f64, {1, shape[2], count, shape[3]});
  for (Index h = 0; h < shape[2]; ++h)
    for (Index i = 0; i < count; ++i)
      for (Index d = 0; d < shape[3]; ++d)
        t.data_as<double>()[(h * count + i) * shape[3] + d] =
            out.data_as<float>()[((first + i) * shape[2] + h) * shape[3] + d];
  return t;
}

struct Expected {
  Tensor context, lse;  // [1, Hq, n_q, Dv], [1, Hq, n_q, 1] float64, per sequence
};

// The float64 reference over each sequence's keys as the pools hold them (gathered
// through its table), with bottom-right alignment.
std::vector<Expected> reference(const Paged& p, const Tokens& tokens, Options options) {
  options.causal_align = CausalAlign::bottom_right;
  options.backend = Backend::reference;
  const Shape& shape = p.shape;
  std::vector<Expected> out;
  for (std::size_t s = 0; s < shape.sequences.size(); ++s) {
    const auto [length, n_q] = shape.sequences[s];
    Expected e{Tensor(DType::f64, {1, shape.heads_q, n_q, shape.dim_v}),
               Tensor(DType::f64, {1, shape.heads_q, n_q, 1})};
    if (length == 0 || n_q == 0) {
      // No key: context 0, and the lse of the sink alone.
      std::fill_n(e.context.data_as<double>(), e.context.numel(), 0.0);
      for (Index h = 0; h < shape.heads_q; ++h) {
        std::fill_n(e.lse.data_as<double>() + h * n_q, n_q,
                    options.sinks.empty() ? -std::numeric_limits<double>::infinity()
                                          : options.sinks[static_cast<std::size_t>(h)]);
      }
      out.push_back(std::move(e));
      continue;
    }
    Tensor q(DType::f64, {1, shape.heads_q, n_q, shape.dim});
    const Tensor q_rows = rows_of_sequence(tokens.q, p.query_start[s], n_q);
    std::copy_n(q_rows.data_as<double>(), q.numel(), q.data_as<double>());
    Tensor k(DType::f64, {1, shape.heads_kv, length, shape.dim});
    Tensor v(DType::f64, {1, shape.heads_kv, length, shape.dim_v});
    for (Index h = 0; h < shape.heads_kv; ++h)
      for (Index t = 0; t < length; ++t) {
        for (Index d = 0; d < shape.dim; ++d)
          k.data_as<double>()[(h * length + t) * shape.dim + d] =
              p.element(false, static_cast<Index>(s), h, t, d);
        for (Index d = 0; d < shape.dim_v; ++d)
          v.data_as<double>()[(h * length + t) * shape.dim_v + d] =
              p.element(true, static_cast<Index>(s), h, t, d);
      }
    forward_into(q.view(), k.view(), v.view(), options,
                 Outputs{e.context.mutable_view(), e.lse.mutable_view(), std::nullopt});
    out.push_back(std::move(e));
  }
  return out;
}

void expect_matches(const Paged& p, const PagedOutput& got, const std::vector<Expected>& want,
                    double context_nmse = 1e-12) {
  for (std::size_t s = 0; s < want.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    const Index first = p.query_start[s], count = p.query_start[s + 1] - first;
    for (const bool lse : {false, true}) {
      const Tensor rows = rows_of_sequence(lse ? got.lse : got.context, first, count);
      const Comparison c = compare(rows.view(), (lse ? want[s].lse : want[s].context).view());
      EXPECT_TRUE(c.hard_failure.empty()) << (lse ? "lse: " : "context: ") << c.hard_failure;
      EXPECT_LT(c.nmse, lse ? 1e-12 : context_nmse) << (lse ? "lse: " : "context: ") << describe(c);
    }
  }
}

// Every kind of sequence a serving step mixes: an empty one asked for queries, one decode
// token, a speculative draft over a long (split) context, more queries than keys, a
// sequence that only holds keys this step, and a prefill run longer than kSplitQueries (and
// its keys than kSplitKeys; no longer, as under qemu each of its products costs).
Shape ragged_shape() {
  Shape shape;
  shape.sequences = {{0, 2}, {37, 1}, {1100, 3}, {5, 9}, {300, 0}, {540, 40}};
  return shape;
}

std::vector<Options> option_list() {
  std::vector<Options> list(6);
  list[0].causal = true;
  list[2].causal = true;
  list[2].window = {200, -1};
  list[3].causal = true;
  list[3].softcap = 15.0;
  list[3].alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  list[4].causal = true;
  list[4].sinks = {0.5f, -1.0f, 2.0f, -std::numeric_limits<float>::infinity()};
  list[4].scale = 0.3;
  list[5].causal = true;
  list[5].position_offset = 3;
  return list;
}

// The options that the n-th pool a test builds runs: every one of option_list() in the full
// sweep, else two of them in turn, so that any three pools in a row run them all (the float64
// reference is most of a case's time natively, and under qemu each SVE case costs seconds).
std::vector<Options> options_of_pool(std::size_t n) {
  std::vector<Options> all = option_list();
  if (full_sweep()) return all;
  return {all[n % all.size()], all[(n + all.size() / 2) % all.size()]};
}

TEST(Paged, MatchesTheReferenceForEveryLayoutDtypePageSizeAndOption) {
  const Shape shape = ragged_shape();
  std::size_t pools = 0;
  for (const CacheDType dtype : kCacheDTypes) {
    const Tokens tokens = make_tokens(shape, dtype, 5);
    for (const Index page : {1, 16, 256}) {
      for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major}) {
        Paged p = make_paged(shape, {dtype, page, layout, true}, tokens, 7);
        for (const Options& options : options_of_pool(pools++)) {
          SCOPED_TRACE(std::string(cache_dtype_name(dtype)) + " page " + std::to_string(page) +
                       " " + page_layout_name(layout) + " causal " +
                       std::to_string(options.causal));
          const std::vector<Expected> want = reference(p, tokens, options);
          expect_matches(p, run(p, tokens, options), want);
        }
      }
    }
  }
}

TEST(Paged, SharedPagesMatchTheReferenceOnEveryTarget) {
  Shape shape;
  shape.sequences = {{1500, 2}, {1300, 4}, {40, 1}};
  shape.share_prefix = true;
  const Tokens tokens = make_tokens(shape, CacheDType::f16, 9);
  Paged p = make_paged(shape, {CacheDType::f16, 16, PageLayout::token_major, true}, tokens, 3);
  ASSERT_EQ(p.table[p.max_pages], p.table[0]);
  Options options;
  options.causal = true;
  const std::vector<Expected> want = reference(p, tokens, options);
  for_each_target([&] { expect_matches(p, run(p, tokens, options), want); });
}

// The bytes of rows [first, first + count) of an output's context and lse.
std::vector<float> row_bits(const PagedOutput& out, Index first, Index count) {
  const Index heads = out.context.shape()[2], dim_v = out.context.shape()[3];
  const float* c = out.context.data_as<float>() + first * heads * dim_v;
  const float* l = out.lse.data_as<float>() + first * heads;
  std::vector<float> bits(c, c + count * heads * dim_v);
  bits.insert(bits.end(), l, l + count * heads);
  return bits;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp may not be given the null data of an empty vector (a sequence with no query).
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A batch of the given sequences of `all` (their queries in q order), reading the same pools.
struct Subset {
  std::vector<std::int32_t> query_start{0}, seq_lens, table;
  Tensor q;
};

Subset subset(const Paged& p, const Tokens& tokens, const std::vector<Index>& picked) {
  Subset out;
  const Index heads = p.shape.heads_q, dim = p.shape.dim;
  Index total = 0;
  for (const Index s : picked) total += p.query_start[s + 1] - p.query_start[s];
  out.q = Tensor(DType::f32, {1, total, heads, dim});
  Index row = 0;
  for (const Index s : picked) {
    const Index n = p.query_start[s + 1] - p.query_start[s];
    std::copy_n(tokens.q.data_as<float>() + p.query_start[s] * heads * dim, n * heads * dim,
                out.q.data_as<float>() + row * heads * dim);
    row += n;
    out.query_start.push_back(static_cast<std::int32_t>(row));
    out.seq_lens.push_back(p.seq_lens[s]);
    out.table.insert(out.table.end(), p.table.begin() + s * p.max_pages,
                     p.table.begin() + (s + 1) * p.max_pages);
  }
  return out;
}

// P rounded to bf16 for P V (pv_precision bf16): each weight off by at most 2^-8 of itself
// (tests/cpu_forward_test.cpp's bound).
constexpr double kRoundedPContextNmse = 1e-5;

// A bf16 cache with bf16 q, d 40 (a tail of 8 past the last 32 pairs) and dim_v 64: on an
// AVX-512 target where vdpbf16ps pays (for_each_target: one target or more on every CPU with
// AVX512-BF16) the scores and P V run on vdpbf16ps
// (cpu/tile/bf16_pairs-inl.h), elsewhere in float32. Exact P holds float32's bound and
// rounded P bf16's; rounded P's bits differ from exact P's exactly where P V runs on
// vdpbf16ps.
TEST(Paged, Bf16ProductsMatchTheReferenceOnEveryTarget) {
  Shape shape = ragged_shape();
  shape.dim_v = 64;
  const Tokens tokens = make_tokens(shape, CacheDType::bf16, 23, DType::bf16);
  for (const Index page : {1, 16, 256}) {
    for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major}) {
      Paged p = make_paged(shape, {CacheDType::bf16, page, layout, true}, tokens, 7);
      for (Options options : option_list()) {
        SCOPED_TRACE("page " + std::to_string(page) + " " + page_layout_name(layout) + " causal " +
                     std::to_string(options.causal));
        const std::vector<Expected> want = reference(p, tokens, options);
        for_each_target([&](std::int64_t target) {
          options.pv_precision = PvPrecision::exact;
          const PagedOutput exact = run(p, tokens, options);
          expect_matches(p, exact, want);
          options.pv_precision = PvPrecision::bf16;
          const PagedOutput rounded = run(p, tokens, options);
          expect_matches(p, rounded, want, kRoundedPContextNmse);
          const Index rows = exact.context.shape()[1];
          const bool on_pairs = target <= HWY_AVX3 && cpu::bf16_dot_pays();
          EXPECT_EQ(same_bytes(row_bits(rounded, 0, rows), row_bits(exact, 0, rows)), !on_pairs);
        });
      }
    }
  }
}

// With float32 q and dim_v 24 the products run in float32; with bf16 q and dim_v 64 on
// vdpbf16ps where the target and CPU have AVX512-BF16 (P rounded by default).
// Pools of `dtype` (int8: one scale for every row, or group, so that pools of any page size
// hold the same values).
void expect_bits_are_each_sequences_own(DType q_dtype, Index dim_v,
                                        CacheDType dtype = CacheDType::bf16, Index group = 0) {
  Shape shape = ragged_shape();
  shape.dim_v = dim_v;
  if (group > 0) shape.dim = 2 * group;
  shape.sequences.push_back({1200, 1});
  shape.sequences.push_back({1100, 1});
  shape.share_prefix = false;
  const Tokens tokens = make_tokens(shape, dtype, 11, q_dtype);
  const bool varied_scales = !has_scales(dtype);
  Options options;
  options.causal = true;
  options.window = {900, -1};
  for_each_target([&] {
    Paged p =
        make_paged(shape, {dtype, 16, PageLayout::token_major, varied_scales, group}, tokens, 13);
    options.threads = 2;
    const PagedOutput all = run(p, tokens, options);
    const auto sequences = static_cast<Index>(shape.sequences.size());
    const auto bits_of = [&](const PagedOutput& out, const std::vector<std::int32_t>& starts,
                             std::size_t i, Index s) {
      return row_bits(out, starts[i], shape.sequences[s].queries);
    };
    // Each sequence alone, and all in reverse order.
    std::vector<Index> reversed(static_cast<std::size_t>(sequences));
    std::iota(reversed.rbegin(), reversed.rend(), 0);
    Subset back = subset(p, tokens, reversed);
    PagePool keys = p.pool(false), values = p.pool(true);
    const PagedOutput reordered =
        paged_attention(queries_in(back.q, tokens.q_dtype).view(), keys, values,
                        {back.query_start, back.seq_lens, back.table, p.max_pages}, options);
    for (Index s = 0; s < sequences; ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      const std::vector<float> want = bits_of(all, p.query_start, static_cast<std::size_t>(s), s);
      Subset alone = subset(p, tokens, {s});
      for (const int threads : {1, 3}) {
        Options o = options;
        o.threads = threads;
        const PagedOutput got =
            paged_attention(queries_in(alone.q, tokens.q_dtype).view(), keys, values,
                            {alone.query_start, alone.seq_lens, alone.table, p.max_pages}, o);
        EXPECT_TRUE(same_bytes(bits_of(got, alone.query_start, 0, s), want))
            << "alone, " << threads << " threads";
      }
      EXPECT_TRUE(same_bytes(
          bits_of(reordered, back.query_start, static_cast<std::size_t>(sequences - 1 - s), s),
          want))
          << "in reverse order";
    }
    // The same tokens in pools of other page sizes and layouts.
    const std::vector<float> want = row_bits(all, 0, all.context.shape()[1]);
    for (const Index page : {1, 7, 64, 256}) {
      for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major}) {
        Paged other = make_paged(shape, {dtype, page, layout, varied_scales, group}, tokens, 17);
        EXPECT_TRUE(
            same_bytes(row_bits(run(other, tokens, options), 0, all.context.shape()[1]), want))
            << "page " << page << " " << page_layout_name(layout);
      }
    }
  });
}

TEST(Paged, EachSequencesBitsAreItsOwnOnEveryTarget) {
  expect_bits_are_each_sequences_own(DType::f32, 24);
  expect_bits_are_each_sequences_own(DType::bf16, 64);
  expect_bits_are_each_sequences_own(DType::f32, 32, CacheDType::int8, 32);
  expect_bits_are_each_sequences_own(DType::f32, 32, CacheDType::int4, 32);
}

TEST(Paged, SharingPagesChangesNoBit) {
  Shape shape;
  shape.sequences = {{1500, 2}, {1300, 3}};
  shape.share_prefix = true;
  const Tokens tokens = make_tokens(shape, CacheDType::f32, 19);
  for_each_target([&] {
    Paged shared =
        make_paged(shape, {CacheDType::f32, 16, PageLayout::head_major, true}, tokens, 23);
    Shape apart = shape;
    apart.share_prefix = false;  // same tokens, each sequence in its own pages
    Paged own = make_paged(apart, {CacheDType::f32, 16, PageLayout::head_major, true}, tokens, 23);
    Options options;
    options.causal = true;
    EXPECT_TRUE(same_bytes(row_bits(run(shared, tokens, options), 0, 5),
                           row_bits(run(own, tokens, options), 0, 5)));
  });
}

// The bits of sequence 0's prompt (its first `prompt` queries) run in chunks of `chunk`
// queries, each call beside sequence 1's one-token step, in row_bits' order.
std::vector<float> chunked_prefill_bits(Paged& p, const Tokens& tokens, const Options& options,
                                        Index prompt, Index chunk) {
  const Shape& shape = p.shape;
  const Index heads = shape.heads_q, dim = shape.dim, dim_v = shape.dim_v;
  const auto other_length = static_cast<std::int32_t>(shape.sequences[1].length);
  std::vector<float> context, lse;
  for (Index begin = 0; begin < prompt; begin += chunk) {
    const Index n = std::min(chunk, prompt - begin);
    Tensor q(DType::f32, {1, n + 1, heads, dim});
    std::copy_n(tokens.q.data_as<float>() + begin * heads * dim, n * heads * dim,
                q.data_as<float>());
    std::copy_n(tokens.q.data_as<float>() + prompt * heads * dim, heads * dim,
                q.data_as<float>() + n * heads * dim);
    const std::vector<std::int32_t> starts{0, static_cast<std::int32_t>(n),
                                           static_cast<std::int32_t>(n + 1)};
    const std::vector<std::int32_t> lengths{static_cast<std::int32_t>(begin + n), other_length};
    const PagedOutput out =
        paged_attention(queries_in(q, tokens.q_dtype).view(), p.pool(false), p.pool(true),
                        {starts, lengths, p.table, p.max_pages}, options);
    const std::vector<float> bits = row_bits(out, 0, n);
    context.insert(context.end(), bits.begin(), bits.begin() + n * heads * dim_v);
    lse.insert(lse.end(), bits.begin() + n * heads * dim_v, bits.end());
  }
  context.insert(context.end(), lse.begin(), lse.end());
  return context;
}

// A prompt of 1100 tokens beside a decoding sequence, prefilled in chunks of 1, 7, 64 and
// at once: each query's bits are the same (a window, so that the runs' first keys differ).
// At once, on 1 thread its 35 query runs are merged tasks (DecodeParts), on 20 each part is
// a task of its own: the same bits, with the window and without. The same for a bf16 cache with
// bf16 q and dim_v 64 (vdpbf16ps where the CPU has it).
TEST(Paged, ChunkedPrefillGivesTheBytesOfOneShotOnEveryTarget) {
  constexpr Index kPrompt = 1100;
  for (const CacheDType dtype : {CacheDType::f16, CacheDType::bf16}) {
    SCOPED_TRACE(cache_dtype_name(dtype));
    Shape shape;
    shape.sequences = {{kPrompt, kPrompt}, {600, 1}};
    if (dtype == CacheDType::bf16) shape.dim_v = 64;
    const Tokens tokens =
        make_tokens(shape, dtype, 29, dtype == CacheDType::bf16 ? DType::bf16 : DType::f32);
    Options options;
    options.causal = true;
    options.window = {300, -1};
    options.softcap = 20.0;
    for_each_target([&] {
      Paged p = make_paged(shape, {dtype, 16, PageLayout::token_major, true}, tokens, 31);
      const std::vector<float> want = row_bits(run(p, tokens, options), 0, kPrompt);
      Options whole = options;  // no window: the last queries' states merge three parts
      whole.window = {-1, -1};
      whole.threads = 20;
      const std::vector<float> whole_bits = row_bits(run(p, tokens, whole), 0, kPrompt);
      for (const int threads : {1, 20}) {
        Options o = options;
        o.threads = whole.threads = threads;
        EXPECT_TRUE(same_bytes(row_bits(run(p, tokens, o), 0, kPrompt), want))
            << "at once, " << threads << " threads";
        EXPECT_TRUE(same_bytes(row_bits(run(p, tokens, whole), 0, kPrompt), whole_bits))
            << "no window, " << threads << " threads";
      }
      for (const Index chunk : {1, 7, 64}) {
        SCOPED_TRACE("chunks of " + std::to_string(chunk));
        EXPECT_TRUE(same_bytes(chunked_prefill_bits(p, tokens, options, kPrompt, chunk), want));
      }
    });
  }
}

// A prefill run (more than DecodeTraits::kWidenRows rows of a KV head) reads each tile of
// 16-bit or int8 rows widened to float32 once, a query alone reads the stored rows: one
// query at a time gives the run's bits for every dtype and every tail of d (d % 16 from 0
// to 15, and d below a vector), on every target; and bf16 q on a bf16 cache (vdpbf16ps
// where the CPU has it, never widened, 32 bf16 a vector: d from 1 to 32, also against
// float64), with dim_v 32.
TEST(Paged, PrefillRunsGiveTheBitsOfOneQueryAtATimeForEveryTailOfD) {
  constexpr Index kPrompt = 45;
  std::vector<Index> dims{1, 2, 3, 5, 128};
  for (Index dim = 16; dim < 32; ++dim) dims.push_back(dim);
  std::vector<Index> pair_dims{128};
  for (Index dim = 1; dim <= 32; ++dim) pair_dims.push_back(dim);
  Options options;
  options.causal = true;
  for (const CacheDType dtype : kCacheDTypes) {
    for (const DType q_dtype : {DType::f32, DType::bf16}) {
      if (q_dtype == DType::bf16 && dtype != CacheDType::bf16) continue;
      for (const Index dim : q_dtype == DType::bf16 ? pair_dims : dims) {
        SCOPED_TRACE(std::string(cache_dtype_name(dtype)) + " d " + std::to_string(dim) +
                     (q_dtype == DType::bf16 ? ", bf16 q" : ""));
        Shape shape;
        shape.dim = dim;
        shape.dim_v = q_dtype == DType::bf16 ? 32 : 24;
        shape.sequences = {{kPrompt, kPrompt}, {20, 1}};
        const Tokens tokens = make_tokens(shape, dtype, static_cast<unsigned>(dim), q_dtype);
        for_each_target([&] {
          Paged p = make_paged(shape, {dtype, 16, PageLayout::token_major, true}, tokens, 5);
          const PagedOutput out = run(p, tokens, options);
          const std::vector<float> want = row_bits(out, 0, kPrompt);
          EXPECT_TRUE(same_bytes(chunked_prefill_bits(p, tokens, options, kPrompt, 1), want));
          // The pairs' tails (d % 32) against float64 too, P rounded.
          if (q_dtype == DType::bf16) {
            expect_matches(p, out, reference(p, tokens, options), kRoundedPContextNmse);
          }
        });
      }
    }
  }
}

// An empty KVCache of the shape's heads and dims.
KVCache cache_of(const Shape& shape, CacheDType dtype, Index max_blocks = 0, Index group = 0,
                 bool zero_point = false, std::optional<CacheDType> dtype_v = std::nullopt) {
  return KVCache({.heads_kv = shape.heads_kv,
                  .dim = shape.dim,
                  .dim_v = shape.dim_v,
                  .page_size = 16,
                  .dtype = dtype,
                  .dtype_v = dtype_v,
                  .group = group,
                  .zero_point = zero_point,
                  .max_blocks = max_blocks});
}

// attn::decode over a KVCache is the same kernel: its bits are those of paged_attention over
// pools holding the cache's tokens.
TEST(Paged, DecodeOverTheKVCacheGivesPagedAttentionsBits) {
  Shape shape;
  shape.dim_v = shape.dim;
  shape.sequences = {{900, 2}, {33, 2}, {1, 2}};
  const Tokens tokens = make_tokens(shape, CacheDType::f16, 37);
  for_each_target([&] {
    KVCache cache = cache_of(shape, CacheDType::f16);
    std::vector<KVCache::SequenceId> ids;
    Tensor q(DType::f32, {3, shape.heads_q, 2, shape.dim});
    for (std::size_t s = 0; s < shape.sequences.size(); ++s) {
      const Index length = shape.sequences[s].length;
      Tensor k(DType::f32, {1, shape.heads_kv, length, shape.dim});
      Tensor v(DType::f32, {1, shape.heads_kv, length, shape.dim_v});
      std::copy_n(tokens.keys[s].data(), k.numel(), k.data_as<float>());
      std::copy_n(tokens.values[s].data(), v.numel(), v.data_as<float>());
      ids.push_back(cache.add_sequence());
      cache.append(ids.back(), k.view(), v.view());
      for (Index h = 0; h < shape.heads_q; ++h)
        for (Index i = 0; i < 2; ++i)
          std::copy_n(tokens.q.data_as<float>() + ((2 * s + i) * shape.heads_q + h) * shape.dim,
                      shape.dim,
                      q.data_as<float>() + ((s * shape.heads_q + h) * 2 + i) * shape.dim);
    }
    Options options;
    options.causal = true;
    const Decoded decoded = decode(q.view(), cache, ids, options);
    Paged p = make_paged(shape, {CacheDType::f16, 48, PageLayout::token_major, true}, tokens, 41);
    const PagedOutput paged = run(p, tokens, options);
    for (Index s = 0; s < 3; ++s)
      for (Index h = 0; h < shape.heads_q; ++h)
        for (Index i = 0; i < 2; ++i) {
          const Index row = 2 * s + i;
          EXPECT_EQ(
              std::memcmp(decoded.context.data_as<float>() +
                              ((s * shape.heads_q + h) * 2 + i) * shape.dim_v,
                          paged.context.data_as<float>() + (row * shape.heads_q + h) * shape.dim_v,
                          static_cast<std::size_t>(shape.dim_v) * sizeof(float)),
              0)
              << "sequence " << s << " head " << h << " query " << i;
        }
  });
}

// The rows of sequence s of a [1, total_q, Hq, d] tensor as decode's [1, Hq, n_q, d] q.
Tensor decode_rows(const Tensor& rows, Index first, Index count) {
  const Index heads = rows.shape()[2], dim = rows.shape()[3];
  Tensor out(DType::f32, {1, heads, count, dim});
  for (Index h = 0; h < heads; ++h)
    for (Index i = 0; i < count; ++i)
      std::copy_n(rows.data_as<float>() + ((first + i) * heads + h) * dim, dim,
                  out.data_as<float>() + (h * count + i) * dim);
  return out;
}

// paged_attention over attn's own KVCache (cache_pools and the cache's block tables) for a
// ragged batch: each sequence's rows are attn::decode's bits for that sequence alone, for
// every storage dtype and a few pairs of key and value dtypes, with a forked sequence sharing
// its parent's pages and a partly filled page copied on write. The pools reserved before the
// first append are the ones appends fill.
TEST(Paged, KVCachePoolsServeARaggedBatchWithDecodesBits) {
  Shape shape;
  shape.dim_v = 24;
  // A prefill run (more rows than DecodeTraits::kWidenRows), a decode token, a draft, none.
  shape.sequences = {{70, 20}, {45, 1}, {51, 3}, {9, 0}};
  std::vector<std::pair<CacheDType, CacheDType>> pairs;
  for (const CacheDType dtype : kCacheDTypes) pairs.emplace_back(dtype, dtype);
  pairs.insert(pairs.end(), {{CacheDType::f16, CacheDType::int8},
                             {CacheDType::int8, CacheDType::fp8_e5m2},
                             {CacheDType::bf16, CacheDType::f32}});
  for (const auto& pair : pairs) {
    // Copies: a lambda below captures them (clang 14 captures no structured binding).
    const CacheDType dtype = pair.first, dtype_v = pair.second;
    SCOPED_TRACE(std::string(cache_dtype_name(dtype)) + " keys, " + cache_dtype_name(dtype_v) +
                 " values");
    const Tokens tokens = make_tokens(shape, dtype, dtype_v, 53);
    for_each_target([&] {
      KVCache cache = cache_of(shape, dtype, 40, 0, false, dtype_v);
      const CachePools before = cache_pools(cache);
      // The first `count` tokens of sequence s's keys and values.
      const auto append = [&](KVCache::SequenceId id, std::size_t s, Index count) {
        const Index length = shape.sequences[s].length;
        Tensor k(DType::f32, {1, shape.heads_kv, count, shape.dim});
        Tensor v(DType::f32, {1, shape.heads_kv, count, shape.dim_v});
        for (Index h = 0; h < shape.heads_kv; ++h) {
          std::copy_n(tokens.keys[s].data() + h * length * shape.dim, count * shape.dim,
                      k.data_as<float>() + h * count * shape.dim);
          std::copy_n(tokens.values[s].data() + h * length * shape.dim_v, count * shape.dim_v,
                      v.data_as<float>() + h * count * shape.dim_v);
        }
        cache.append(id, k.view(), v.view());
      };
      std::vector<KVCache::SequenceId> ids;
      for (std::size_t s = 0; s < shape.sequences.size(); ++s) {
        ids.push_back(cache.add_sequence());
        append(ids.back(), s, shape.sequences[s].length);
      }
      // Sequence 4: a fork of sequence 1 (45 tokens, its last page partly filled and then
      // copied on write) with 6 tokens of its own.
      const KVCache::SequenceId forked = cache.fork(ids[1]);
      append(forked, 2, 6);
      ids.push_back(forked);
      const std::vector<Index> lengths = {70, 45, 51, 9, 51};
      const std::vector<Index> queries = {20, 1, 3, 0, 2};
      const CachePools pools = cache_pools(cache);
      EXPECT_EQ(pools.keys.data, before.keys.data);
      EXPECT_EQ(pools.values.data, before.values.data);
      EXPECT_EQ(pools.keys.layout, PageLayout::head_major);
      EXPECT_EQ(pools.keys.pages, 40);
      EXPECT_EQ(pools.values.dim, shape.dim_v);
      EXPECT_EQ(pools.values.dtype, dtype_v);

      const KVCache::Reading reading = cache.read(ids, "ids");
      Index max_pages = 0;
      for (std::size_t s = 0; s < ids.size(); ++s) {
        max_pages = std::max<Index>(max_pages, static_cast<Index>(reading.block_table(s).size()));
      }
      std::vector<std::int32_t> table(ids.size() * static_cast<std::size_t>(max_pages), 0);
      std::vector<std::int32_t> seq_lens, query_start = {0};
      for (std::size_t s = 0; s < ids.size(); ++s) {
        std::copy(reading.block_table(s).begin(), reading.block_table(s).end(),
                  table.begin() + static_cast<std::ptrdiff_t>(s) * max_pages);
        EXPECT_EQ(reading.length(s), lengths[s]);
        seq_lens.push_back(static_cast<std::int32_t>(reading.length(s)));
        query_start.push_back(query_start.back() + static_cast<std::int32_t>(queries[s]));
      }
      Tensor q(DType::f32, {1, query_start.back(), shape.heads_q, shape.dim});
      std::mt19937_64 rng(59);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (Index i = 0; i < q.numel(); ++i) q.data_as<float>()[i] = normal(rng);
      Options options;
      options.causal = true;
      const PagedOutput paged = paged_attention(q.view(), pools.keys, pools.values,
                                                {query_start, seq_lens, table, max_pages}, options);
      for (std::size_t s = 0; s < ids.size(); ++s) {
        if (queries[s] == 0) continue;
        const Tensor rows = decode_rows(q, query_start[s], queries[s]);
        const Decoded alone = decode(rows.view(), cache, {ids[s]}, options);
        for (Index h = 0; h < shape.heads_q; ++h)
          for (Index i = 0; i < queries[s]; ++i)
            EXPECT_EQ(
                std::memcmp(alone.context.data_as<float>() + (h * queries[s] + i) * shape.dim_v,
                            paged.context.data_as<float>() +
                                ((query_start[s] + i) * shape.heads_q + h) * shape.dim_v,
                            static_cast<std::size_t>(shape.dim_v) * sizeof(float)),
                0)
                << "sequence " << s << " head " << h << " query " << i;
      }
    });
  }
}

TEST(Paged, KVCachePoolsNeedMaxBlocks) {
  KVCache growing({.heads_kv = 2, .dim = 8, .dim_v = 8, .page_size = 4, .max_blocks = 0});
  EXPECT_EQ(error_message([&] { cache_pools(growing); }).rfind("max_blocks: expected", 0), 0u);
  const std::string huge = error_message([] {
    KVCache({.heads_kv = 1024,
             .dim = 1024,
             .dim_v = 1024,
             .page_size = 4096,
             .dtype = CacheDType::f32,
             .max_blocks = INT32_MAX});
  });
  EXPECT_EQ(huge.rfind("max_blocks: expected", 0), 0u) << huge;
}

TEST(Paged, BadBatchesAreRefusedNamingTheArgument) {
  Shape shape;
  shape.sequences = {{20, 1}, {40, 2}};
  const Tokens tokens = make_tokens(shape, CacheDType::int8, 43);
  Paged p = make_paged(shape, {CacheDType::int8, 16, PageLayout::token_major, true}, tokens, 47);
  const auto starts = [](const std::string& text, const std::string& prefix) {
    return text.rfind(prefix, 0) == 0 ? ::testing::AssertionSuccess()
                                      : ::testing::AssertionFailure() << text;
  };
  const auto error_of = [&](PagePool keys, PagePool values, PagedBatch batch,
                            const Options& options = {}) {
    return error_message([&] { paged_attention(tokens.q.view(), keys, values, batch, options); });
  };
  const PagePool keys = p.pool(false), values = p.pool(true);
  PagedBatch batch = p.batch();
  std::vector<std::int32_t> table = p.table;
  table[1] = static_cast<std::int32_t>(p.pages);  // past the pool
  EXPECT_TRUE(starts(error_of(keys, values, {p.query_start, p.seq_lens, table, p.max_pages}),
                     "block_table: expected pages in [0, "));
  table[1] = -1;
  EXPECT_TRUE(starts(error_of(keys, values, {p.query_start, p.seq_lens, table, p.max_pages}),
                     "block_table: expected pages in [0, "));
  const std::vector<std::int32_t> too_long{20, static_cast<std::int32_t>(p.max_pages * 16 + 1)};
  EXPECT_TRUE(starts(error_of(keys, values, {p.query_start, too_long, p.table, p.max_pages}),
                     "seq_lens: expected lengths from 0 to max_pages * page_size"));
  const std::vector<std::int32_t> negative{20, -1};
  EXPECT_TRUE(starts(error_of(keys, values, {p.query_start, negative, p.table, p.max_pages}),
                     "seq_lens: "));
  const std::vector<std::int32_t> one_length{20};
  EXPECT_TRUE(starts(error_of(keys, values, {p.query_start, one_length, p.table, p.max_pages}),
                     "seq_lens: expected 2 lengths"));
  const std::vector<std::int32_t> falling{0, 2, 1}, short_total{0, 1, 2}, late{1, 2, 3};
  EXPECT_TRUE(starts(error_of(keys, values, {falling, p.seq_lens, p.table, p.max_pages}),
                     "query_start: expected non-decreasing offsets"));
  EXPECT_TRUE(starts(error_of(keys, values, {short_total, p.seq_lens, p.table, p.max_pages}),
                     "query_start: expected a last offset equal to q's 3 rows"));
  EXPECT_TRUE(starts(error_of(keys, values, {late, p.seq_lens, p.table, p.max_pages}),
                     "query_start: expected offsets from 0"));
  EXPECT_TRUE(starts(error_of(keys, values, {p.query_start, p.seq_lens, p.table, p.max_pages + 1}),
                     "block_table: expected 2 x "));
  PagePool unscaled = keys;
  unscaled.scales = nullptr;
  EXPECT_TRUE(starts(error_of(unscaled, values, batch),
                     "keys.scales: expected float32 scales for int8, one per token and KV head"));
  std::vector<float> head_scales{0.5f, std::numeric_limits<float>::quiet_NaN()};
  PagePool fp8_keys = keys, fp8_values = values;
  fp8_keys.dtype = fp8_values.dtype = CacheDType::fp8_e4m3;
  fp8_keys.scales = head_scales.data();
  fp8_values.scales = nullptr;
  EXPECT_TRUE(starts(error_of(fp8_keys, fp8_values, batch),
                     "keys.scales: expected a positive finite scale per KV head, given nan for "
                     "head 1"));
  head_scales[1] = 0.0f;
  EXPECT_TRUE(starts(error_of(fp8_keys, fp8_values, batch),
                     "keys.scales: expected a positive finite scale per KV head, given 0.000000 "
                     "for head 1"));
  PagePool other_layout = values;
  other_layout.layout = PageLayout::head_major;
  EXPECT_TRUE(
      starts(error_of(keys, other_layout, batch), "values.layout: expected the key pool's"));
  PagePool bad_group = keys;
  bad_group.group = 16;
  EXPECT_TRUE(starts(error_of(bad_group, values, batch),
                     "keys.group: expected 0 (a scale per row), or 32, 64 or 128 dividing the "
                     "head dim (40), given 16"));
  PagePool grouped_values = values;
  grouped_values.dim = grouped_values.group = 32;
  EXPECT_TRUE(
      starts(error_of(keys, grouped_values, batch), "values.group: expected the key pool's"));
  PagePool zero_point_keys = keys;
  zero_point_keys.zero_point = true;
  EXPECT_TRUE(starts(error_of(zero_point_keys, values, batch),
                     "values.zero_point: expected the key pool's true (one page holds both), "
                     "given false"));
  PagePool fp8_zero_points = fp8_keys;
  fp8_zero_points.scales = nullptr;
  fp8_zero_points.zero_point = true;
  EXPECT_TRUE(starts(error_of(fp8_zero_points, fp8_values, batch),
                     "keys.zero_point: expected false for fp8_e4m3 (zero points are for int8 and "
                     "int4), given true"));
  PagePool int4_keys = keys;
  int4_keys.dtype = CacheDType::int4;
  EXPECT_TRUE(
      starts(error_of(int4_keys, values, batch),
             "keys.dim: expected a multiple of 32 for int4 (blocks of 32 codes), given 40"));
  PagePool no_data = keys;
  no_data.data = nullptr;
  EXPECT_TRUE(starts(error_of(no_data, values, batch), "keys.data: "));
  PagePool no_pages = values;
  no_pages.page_size = 0;
  EXPECT_TRUE(starts(error_of(keys, no_pages, batch), "values.page_size: expected a positive"));
  PagePool wide = keys;
  wide.dim = shape.dim + 1;
  EXPECT_TRUE(starts(error_of(wide, values, batch), "q: expected shape [1, total_q, Hq, 41"));
  Options masked;
  masked.mask = tokens.q.view();
  EXPECT_TRUE(starts(error_of(keys, values, batch, masked), "mask: "));
  Options dropout;
  dropout.dropout_p = 0.1;
  EXPECT_TRUE(starts(error_of(keys, values, batch, dropout), "dropout_p: expected 0 (decode"));
  Options packed;
  packed.cu_seqlens_q = {0, 1};
  packed.cu_seqlens_k = {0, 1};
  EXPECT_TRUE(starts(error_of(keys, values, batch, packed), "cu_seqlens: "));
  Options reference;
  reference.backend = Backend::reference;
  EXPECT_TRUE(starts(error_of(keys, values, batch, reference), "backend: "));
  Options sinks;
  sinks.sinks = {1.0f};
  EXPECT_TRUE(starts(error_of(keys, values, batch, sinks), "sinks: expected 4 values"));
}

// [1, n, Hkv, dim] float32 rows of sequence s's tokens [first, first + n), from the codes
// (int8, int4: the codes times unit_of, so the pages' scales are found by the append; fp8
// with head scales: times scaled_by's, which the append divides out).
Tensor new_rows(const Shape& shape, const Tokens& tokens, bool values, Index s, Index first,
                Index n, CacheDType dtype, const Paged* scaled_by = nullptr) {
  const Index dim = values ? shape.dim_v : shape.dim, length = shape.sequences[s].length;
  const auto& codes = (values ? tokens.values : tokens.keys)[static_cast<std::size_t>(s)];
  Tensor t(DType::f32, {1, n, shape.heads_kv, dim});
  const float unit = has_scales(dtype) ? unit_of(dtype) : 1.0f;
  for (Index i = 0; i < n; ++i)
    for (Index h = 0; h < shape.heads_kv; ++h)
      for (Index d = 0; d < dim; ++d)
        t.data_as<float>()[(i * shape.heads_kv + h) * dim + d] = static_cast<float>(
            codes[static_cast<std::size_t>((h * length + first + i) * dim + d)] * unit *
            (scaled_by != nullptr ? scaled_by->head_scale(values, h) : 1.0));
  return t;
}

// The sequences' tokens appended in steps of 1 to 300 tokens, each step one call for all
// sequences (slots from the table, a padding slot between them), into zeroed pools.
void append_all(Paged& p, const Tokens& tokens, unsigned seed) {
  std::fill(p.key_bytes.begin(), p.key_bytes.end(), std::byte{0});
  std::fill(p.value_bytes.begin(), p.value_bytes.end(), std::byte{0});
  std::mt19937_64 rng(seed);
  const Shape& shape = p.shape;
  const auto sequences = static_cast<Index>(shape.sequences.size());
  std::vector<Index> done(static_cast<std::size_t>(sequences), 0);
  for (bool more = true; more;) {
    more = false;
    std::vector<std::int64_t> slots;
    std::vector<Tensor> k, v;
    for (Index s = 0; s < sequences; ++s) {
      const Index length = shape.sequences[s].length;
      const Index n = std::min<Index>(length - done[s], 1 + static_cast<Index>(rng() % 300));
      for (Index t = done[s]; t < done[s] + n; ++t) {
        slots.push_back(p.table[s * p.max_pages + t / p.storage.page] * p.storage.page +
                        t % p.storage.page);
      }
      slots.push_back(-1);
      k.push_back(new_rows(shape, tokens, false, s, done[s], n, p.storage.dtype_of(false), &p));
      v.push_back(new_rows(shape, tokens, true, s, done[s], n, p.storage.dtype_of(true), &p));
      done[s] += n;
      more = more || done[s] < length;
    }
    const auto joined = [&](const std::vector<Tensor>& parts, Index dim) {
      Tensor all(DType::f32, {1, static_cast<Index>(slots.size()), shape.heads_kv, dim});
      float* to = all.data_as<float>();
      for (const Tensor& part : parts) {
        to = std::copy_n(part.data_as<float>(), part.numel(), to);
        to = std::fill_n(to, shape.heads_kv * dim, 1e30f);  // the padding token, never written
      }
      return all;
    };
    append_pages(joined(k, shape.dim).view(), joined(v, shape.dim_v).view(), slots, p.pool(false),
                 p.pool(true));
  }
}

TEST(Paged, AppendedPagesHoldTheTokensForEveryLayoutAndDtype) {
  Shape shape;
  shape.sequences = {{700, 1}, {1, 1}, {333, 4}};
  for (const CacheDType dtype : kCacheDTypes) {
    const Tokens tokens = make_tokens(shape, dtype, 53);
    for (const Index page : {1, 16, 256}) {
      for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major}) {
        SCOPED_TRACE(std::string(cache_dtype_name(dtype)) + " page " + std::to_string(page) + " " +
                     page_layout_name(layout));
        Paged p = make_paged(shape, {dtype, page, layout, false}, tokens, 59);
        Paged appended = p;
        append_all(appended, tokens, 61);
        if (dtype != CacheDType::int8) {
          // The tokens' bits, where the builder put them; the spare pages untouched.
          std::vector<std::byte> zeroed = p.key_bytes;
          EXPECT_EQ(appended.key_bytes.size(), zeroed.size());
          for (Index s = 0; s < 3; ++s)
            for (Index h = 0; h < shape.heads_kv; ++h)
              for (Index t = 0; t < shape.sequences[s].length; ++t)
                for (Index d = 0; d < shape.dim; ++d)
                  ASSERT_EQ(appended.element(false, s, h, t, d), p.element(false, s, h, t, d));
        }
        Options options;
        options.causal = true;
        const std::vector<Expected> want = reference(appended, tokens, options);
        expect_matches(appended, run(appended, tokens, options), want);
      }
    }
  }
}

// int8 and int4 with a scale per group of 32 or 64 elements of each row (int4 also with one
// per row), both also with zero points (an offset beside each scale; int8's per row of 72
// and 40, so that rows end in a tail shorter than a vector), and fp8 with a scale per KV head
// (given, as vLLM's k_scale): pools built with random scales, and pools written by
// append_pages (which finds int8's and int4's scales and divides by fp8's), against float64 on
// every target, for both layouts and a page of one token or many. The context's bound is ten
// times the float kernels': each element is read as its float32 product with its scale (plus
// offset), rounded once, and rows of 128 sum longer.
TEST(Paged, ScaledCodesMatchTheReferenceOnEveryTarget) {
  std::size_t pools = 0;
  for (const auto& [dtype, dim, dim_v, group, zero_point] :
       {std::tuple{CacheDType::int8, Index{64}, Index{32}, Index{32}, false},
        std::tuple{CacheDType::int8, Index{128}, Index{128}, Index{64}, false},
        std::tuple{CacheDType::int8, Index{72}, Index{40}, Index{0}, true},
        std::tuple{CacheDType::int4, Index{64}, Index{32}, Index{32}, false},
        std::tuple{CacheDType::int4, Index{128}, Index{64}, Index{0}, false},
        std::tuple{CacheDType::int4, Index{64}, Index{32}, Index{32}, true},
        std::tuple{CacheDType::fp8_e4m3, Index{64}, Index{32}, Index{0}, false},
        std::tuple{CacheDType::fp8_e5m2, Index{40}, Index{24}, Index{0}, false}}) {
    // ragged_shape's kinds of sequence (empty, short, split into parts, many queries, none)
    // with fewer keys and queries: the float64 reference is most of the time, under qemu above
    // all.
    Shape shape;
    shape.sequences = {{0, 2}, {37, 1}, {600, 3}, {5, 9}, {130, 0}, {240, 20}};
    shape.dim = dim;
    shape.dim_v = dim_v;
    const Tokens tokens = make_tokens(shape, dtype, 83);
    for (const Index page : {1, 16}) {
      for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major}) {
        SCOPED_TRACE(std::string(cache_dtype_name(dtype)) + " d " + std::to_string(dim) +
                     " group " + std::to_string(group) + (zero_point ? " zero points" : "") +
                     " page " + std::to_string(page) + " " + page_layout_name(layout));
        Paged built = make_paged(
            shape, {dtype, page, layout, true, group, is_fp8(dtype), zero_point}, tokens, 89);
        Paged appended = built;
        append_all(appended, tokens, 97);
        for (const Options& options : options_of_pool(pools++)) {
          for (Paged* p : {&built, &appended}) {
            const std::vector<Expected> want = reference(*p, tokens, options);
            for_each_target([&] { expect_matches(*p, run(*p, tokens, options), want, 1e-11); });
          }
        }
      }
    }
  }
}

// Keys and values in two dtypes (llama.cpp's type_k and type_v): every key dtype once, beside
// values of every reader (f32, f16, bf16; int8 per row, per group, with zero points; int4;
// fp8 with and without head scales), a head dim with a tail where the dtypes allow, pools
// built and appended, against float64 on every target, with the bound of the scaled codes.
TEST(Paged, KeysAndValuesOfTwoDtypesMatchTheReferenceOnEveryTarget) {
  struct Pair {
    CacheDType keys, values;
    Index dim, dim_v, group;
    bool zero_point, head_scales;
  };
  std::size_t pools = 0, pairs = 0;
  for (const Pair& pair :
       {Pair{CacheDType::int8, CacheDType::f16, 72, 40, 0, false, false},
        Pair{CacheDType::int8, CacheDType::int4, 64, 32, 32, true, false},
        Pair{CacheDType::int4, CacheDType::int8, 64, 32, 0, false, false},
        Pair{CacheDType::int4, CacheDType::fp8_e4m3, 64, 24, 32, false, true},
        Pair{CacheDType::fp8_e4m3, CacheDType::bf16, 40, 24, 0, false, true},
        Pair{CacheDType::fp8_e5m2, CacheDType::fp8_e4m3, 40, 24, 0, false, false},
        Pair{CacheDType::f32, CacheDType::fp8_e5m2, 40, 24, 0, false, true},
        Pair{CacheDType::f32, CacheDType::int8, 40, 64, 32, false, false},
        Pair{CacheDType::f16, CacheDType::int4, 40, 32, 32, true, false},
        Pair{CacheDType::bf16, CacheDType::int8, 72, 40, 0, true, false}}) {
    Shape shape;
    shape.sequences = {{0, 2}, {37, 1}, {600, 3}, {5, 9}, {130, 0}, {240, 20}};
    shape.dim = pair.dim;
    shape.dim_v = pair.dim_v;
    const Tokens tokens = make_tokens(shape, pair.keys, pair.values, 101);
    const bool flip = pairs++ % 2 == 1;
    for (const Index page : {1, 16}) {
      const PageLayout layout =
          (page == 1) != flip ? PageLayout::token_major : PageLayout::head_major;
      SCOPED_TRACE(std::string("keys ") + cache_dtype_name(pair.keys) + ", values " +
                   cache_dtype_name(pair.values) + " group " + std::to_string(pair.group) +
                   (pair.zero_point ? " zero points" : "") + " page " + std::to_string(page) + " " +
                   page_layout_name(layout));
      Paged built = make_paged(shape,
                               {pair.keys, page, layout, true, pair.group, pair.head_scales,
                                pair.zero_point, pair.values},
                               tokens, 103);
      Paged appended = built;
      append_all(appended, tokens, 107);
      for (const Options& options : options_of_pool(pools++)) {
        for (Paged* p : {&built, &appended}) {
          const std::vector<Expected> want = reference(*p, tokens, options);
          for_each_target([&] { expect_matches(*p, run(*p, tokens, options), want, 1e-11); });
        }
      }
    }
  }
}

// Pages appended by append_pages and by a KVCache in the same runs of tokens.
void expect_pages_are_the_kv_caches_bytes(CacheDType dtype, Index group, bool zero_point) {
  Shape shape;
  shape.dim = shape.dim_v = 64;
  shape.sequences = {{100, 1}};
  const Tokens tokens = make_tokens(shape, dtype, 67);
  KVCache cache = cache_of(shape, dtype, 0, group, zero_point);
  const KVCache::SequenceId id = cache.add_sequence();
  Paged p = make_paged(shape, {dtype, 16, PageLayout::head_major, false, group, false, zero_point},
                       tokens, 71);
  // Runs of 1, 6, 11, ... tokens: some start mid-page, some cross pages.
  for (Index first = 0, run = 1; first < 100; first += run, run += 5) {
    const Index n = std::min<Index>(run, 100 - first);
    std::vector<std::int64_t> slots;
    for (Index t = first; t < first + n; ++t)
      slots.push_back(p.table[static_cast<std::size_t>(t / 16)] * 16 + t % 16);
    const Tensor k = new_rows(shape, tokens, false, 0, first, n, dtype);
    const Tensor v = new_rows(shape, tokens, true, 0, first, n, dtype);
    append_pages(k.view(), v.view(), slots, p.pool(false), p.pool(true));
    // The cache takes [1, Hkv, n, dim]: the same rows, heads first.
    Tensor kh(DType::f32, {1, shape.heads_kv, n, shape.dim});
    Tensor vh(DType::f32, {1, shape.heads_kv, n, shape.dim});
    for (Index i = 0; i < n; ++i)
      for (Index h = 0; h < shape.heads_kv; ++h) {
        std::copy_n(k.data_as<float>() + (i * shape.heads_kv + h) * shape.dim, shape.dim,
                    kh.data_as<float>() + (h * n + i) * shape.dim);
        std::copy_n(v.data_as<float>() + (i * shape.heads_kv + h) * shape.dim, shape.dim,
                    vh.data_as<float>() + (h * n + i) * shape.dim);
      }
    cache.append(id, kh.view(), vh.view());
  }
  const Tensor keys = cache.keys(id), values = cache.values(id);
  for (Index h = 0; h < shape.heads_kv; ++h)
    for (Index t = 0; t < 100; ++t)
      for (Index d = 0; d < shape.dim; ++d) {
        ASSERT_EQ(keys.data_as<float>()[(h * 100 + t) * shape.dim + d],
                  static_cast<float>(p.element(false, 0, h, t, d)));
        ASSERT_EQ(values.data_as<float>()[(h * 100 + t) * shape.dim + d],
                  static_cast<float>(p.element(true, 0, h, t, d)));
      }
}

// The KVCache writes its pages with the same code: int8 and int4 pages appended in the same
// runs hold the same bytes and scales, with a scale per row or per group of 32, with and
// without zero points.
TEST(Paged, AppendedScaledPagesAreTheKVCachesBytes) {
  for (const CacheDType dtype : {CacheDType::int8, CacheDType::int4}) {
    for (const Index group : {0, 32}) {
      for (const bool zero_point : {false, true}) {
        SCOPED_TRACE(std::string(cache_dtype_name(dtype)) + " group " + std::to_string(group) +
                     (zero_point ? " zero points" : ""));
        expect_pages_are_the_kv_caches_bytes(dtype, group, zero_point);
      }
    }
  }
}

// A KVCache of fp8 with a scale per KV head (KVCacheConfig::k_scale, v_scale): each element
// stored as the code of x / scale and read back as code * scale; cache_pools shows the
// scales, and paged_attention over the pools gives decode's bits, within float32's bound of
// float64 over what the cache holds, on every target. Scales for another dtype, of another
// count, or not positive and finite are refused naming the field.
TEST(Paged, Fp8CacheHeadScalesAreStoredShownAndRead) {
  constexpr Index kHeadsKv = 2, kHeadsQ = 4, kDim = 64, kDimV = 32, kLength = 70;
  const std::vector<float> k_scale{0.5f, 3.0f}, v_scale{2.0f, 0.25f};
  std::mt19937_64 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor k(DType::f32, {1, kHeadsKv, kLength, kDim}), v(DType::f32, {1, kHeadsKv, kLength, kDimV});
  for (Index i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = 4.0f * normal(rng);
  for (Index i = 0; i < v.numel(); ++i) v.data_as<float>()[i] = normal(rng);
  for (const CacheDType dtype : {CacheDType::fp8_e4m3, CacheDType::fp8_e5m2}) {
    SCOPED_TRACE(cache_dtype_name(dtype));
    KVCache cache({.heads_kv = kHeadsKv,
                   .dim = kDim,
                   .dim_v = kDimV,
                   .page_size = 16,
                   .dtype = dtype,
                   .max_blocks = 8,
                   .k_scale = k_scale,
                   .v_scale = v_scale});
    const KVCache::SequenceId id = cache.add_sequence();
    cache.append(id, k.view(), v.view());
    for (const bool values : {false, true}) {
      const Tensor& given = values ? v : k;
      const Tensor got = values ? cache.values(id) : cache.keys(id);
      const Index dim = values ? kDimV : kDim;
      for (Index h = 0; h < kHeadsKv; ++h) {
        const float scale = (values ? v_scale : k_scale)[static_cast<std::size_t>(h)];
        for (Index i = h * kLength * dim; i < (h + 1) * kLength * dim; ++i) {
          const float x = given.data_as<float>()[i] / scale;
          const float code = dtype == CacheDType::fp8_e4m3 ? to_float(to_float8_e4m3(x))
                                                           : to_float(to_float8_e5m2(x));
          ASSERT_EQ(got.data_as<float>()[i], code * scale) << "element " << i;
        }
      }
    }
    const CachePools pools = cache_pools(cache);
    ASSERT_NE(pools.keys.scales, nullptr);
    EXPECT_EQ(std::vector<float>(pools.keys.scales, pools.keys.scales + kHeadsKv), k_scale);
    EXPECT_EQ(std::vector<float>(pools.values.scales, pools.values.scales + kHeadsKv), v_scale);
    Tensor q(DType::f32, {1, kHeadsQ, 1, kDim});
    for (Index i = 0; i < q.numel(); ++i) q.data_as<float>()[i] = normal(rng);
    Tensor want_context(DType::f64, {1, kHeadsQ, 1, kDimV}),
        want_lse(DType::f64, {1, kHeadsQ, 1, 1});
    const Tensor keys = cache.keys(id), values = cache.values(id);
    forward_into(q.view(), keys.view(), values.view(), {},
                 Outputs{want_context.mutable_view(), want_lse.mutable_view(), std::nullopt});
    const std::vector<std::int32_t> table = cache.block_table(id);
    const std::vector<std::int32_t> query_start{0, 1}, seq_lens{kLength};
    // q as paged_attention takes it, [1, total_q, Hq, D]: the same floats in the same order.
    Tensor q_rows(DType::f32, {1, 1, kHeadsQ, kDim});
    std::copy_n(q.data_as<float>(), q.numel(), q_rows.data_as<float>());
    for_each_target([&] {
      const Decoded decoded = decode(q.view(), cache, {id});
      const PagedOutput paged =
          paged_attention(q_rows.view(), pools.keys, pools.values,
                          {query_start, seq_lens, table, static_cast<Index>(table.size())});
      EXPECT_EQ(std::memcmp(decoded.context.data(), paged.context.data(),
                            static_cast<std::size_t>(kHeadsQ * kDimV) * sizeof(float)),
                0);
      EXPECT_LT(compare(decoded.context.view(), want_context.view()).nmse, 1e-12);
      EXPECT_LT(compare(decoded.lse.view(), want_lse.view()).nmse, 1e-12);
    });
  }
  const auto refused = [](KVCacheConfig config) {
    return error_message([&] { KVCache cache(config); });
  };
  const KVCacheConfig fp8{.heads_kv = 2, .dtype = CacheDType::fp8_e4m3};
  KVCacheConfig one_scale = fp8;
  one_scale.k_scale = {1.0f};
  EXPECT_EQ(refused(one_scale), "k_scale: expected one scale per KV head (2), given 1");
  KVCacheConfig zero_scale = fp8;
  zero_scale.v_scale = {1.0f, 0.0f};
  EXPECT_EQ(refused(zero_scale),
            "v_scale: expected a positive finite scale per KV head, given 0.000000 for head 1");
  KVCacheConfig int8 = one_scale;
  int8.dtype = CacheDType::int8;
  EXPECT_EQ(refused(int8),
            "k_scale: expected none for int8 (a scale per KV head is for fp8), given 1 scales");
}

TEST(Paged, BadAppendsAreRefusedNamingTheArgumentAndWriteNothing) {
  Shape shape;
  shape.sequences = {{20, 1}};
  const Tokens tokens = make_tokens(shape, CacheDType::int8, 73);
  Paged p = make_paged(shape, {CacheDType::int8, 16, PageLayout::token_major, true}, tokens, 79);
  const Paged before = p;
  const Tensor k = new_rows(shape, tokens, false, 0, 0, 3, CacheDType::int8);
  const Tensor v = new_rows(shape, tokens, true, 0, 0, 3, CacheDType::int8);
  const auto error_of = [&](const TensorView& kk, const TensorView& vv,
                            std::vector<std::int64_t> slots) {
    return error_message([&] { append_pages(kk, vv, slots, p.pool(false), p.pool(true)); });
  };
  const auto starts = [](const std::string& text, const std::string& prefix) {
    return text.rfind(prefix, 0) == 0 ? ::testing::AssertionSuccess()
                                      : ::testing::AssertionFailure() << text;
  };
  const std::int64_t past = p.pages * 16;
  EXPECT_TRUE(starts(error_of(k.view(), v.view(), {0, 1, past}),
                     "slots: expected slots below pages * page_size"));
  EXPECT_TRUE(starts(error_of(k.view(), v.view(), {5, 6, 5}),
                     "slots: expected each slot at most once, given slot 5 for tokens 0 and 2"));
  EXPECT_TRUE(
      starts(error_of(k.view(), v.view(), {0, 1}), "k: expected shape [1, 2 (one per slot)"));
  EXPECT_TRUE(starts(error_of(k.view(), k.view(), {0, 1, 2}), "v: expected shape [1, 3"));
  Tensor bad = new_rows(shape, tokens, false, 0, 0, 3, CacheDType::int8);
  bad.data_as<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(starts(error_of(bad.view(), v.view(), {0, 1, 2}), "k: expected finite values"));
  EXPECT_EQ(p.key_bytes, before.key_bytes);
  EXPECT_EQ(p.value_bytes, before.value_bytes);
  EXPECT_EQ(p.key_scales, before.key_scales);
  EXPECT_EQ(p.value_scales, before.value_scales);
}

// Cosine and sine tables [positions, half] of the usual inverse-frequency angles.
struct RotaryTables {
  std::vector<float> cos, sin;
  Index half = 0;

  RotaryTables(Index positions, Index dims) : half(dims / 2) {
    for (Index p = 0; p < positions; ++p)
      for (Index j = 0; j < half; ++j) {
        const double angle = static_cast<double>(p) * std::pow(10000.0, -2.0 * j / dims);
        cos.push_back(static_cast<float>(std::cos(angle)));
        sin.push_back(static_cast<float>(std::sin(angle)));
      }
  }
  // row[0 .. 2 half) rotated at position p: written out here, apart from the library's.
  void rotate(std::vector<double>& row, Index p, RotaryStyle style) const {
    for (Index j = 0; j < half; ++j) {
      const Index a = style == RotaryStyle::neox ? j : 2 * j;
      const Index b = style == RotaryStyle::neox ? j + half : 2 * j + 1;
      const double c = cos[static_cast<std::size_t>(p * half + j)];
      const double s = sin[static_cast<std::size_t>(p * half + j)];
      const double x = row[a], y = row[b];
      row[a] = x * c - y * s;
      row[b] = y * c + x * s;
    }
  }
};

// x rounded once to the dtype (to nearest even): through float rounded to odd, so that the
// second rounding cannot differ from one.
double rounded(double x, CacheDType dtype) {
  float odd = static_cast<float>(x);
  std::uint32_t bits = 0;
  std::memcpy(&bits, &odd, 4);
  if (static_cast<double>(odd) != x && bits % 2 == 0) {
    odd = std::nextafter(odd, x > odd ? std::numeric_limits<float>::infinity()
                                      : -std::numeric_limits<float>::infinity());
  }
  switch (dtype) {
    case CacheDType::f16:
      return to_float(to_float16(odd));
    case CacheDType::bf16:
      return to_float(to_bfloat16(odd));
    default:
      return static_cast<float>(x);
  }
}

// Keys rotated as they are appended and queries as they are scored, both styles, partial and
// whole: the pools hold each key rotated in float64 and rounded once; the context is the
// float64 reference's over rotated queries and those keys.
TEST(Paged, RotaryKeysAndQueriesMatchTheReference) {
  Shape shape;
  shape.sequences = {{300, 5}, {40, 1}, {9, 9}};
  for (const RotaryStyle style : {RotaryStyle::neox, RotaryStyle::interleaved}) {
    for (const Index dims : {Index{16}, shape.dim}) {
      for (const CacheDType dtype : {CacheDType::f32, CacheDType::bf16}) {
        for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major}) {
          SCOPED_TRACE(std::string(style == RotaryStyle::neox ? "neox" : "interleaved") + " dims " +
                       std::to_string(dims) + " " + cache_dtype_name(dtype) + " " +
                       page_layout_name(layout));
          const Tokens tokens = make_tokens(shape, dtype, 83);
          Paged p = make_paged(shape, {dtype, 16, layout, false}, tokens, 89);
          const RotaryTables tables(400, dims);
          std::fill(p.key_bytes.begin(), p.key_bytes.end(), std::byte{0});
          std::fill(p.value_bytes.begin(), p.value_bytes.end(), std::byte{0});
          for (Index s = 0; s < 3; ++s) {
            const Index length = shape.sequences[s].length;
            std::vector<std::int64_t> slots;
            std::vector<std::int32_t> positions;
            for (Index t = 0; t < length; ++t) {
              slots.push_back(p.table[s * p.max_pages + t / 16] * 16 + t % 16);
              positions.push_back(static_cast<std::int32_t>(t));
            }
            const Rotary rotary{style, dims == shape.dim ? 0 : dims, tables.cos, tables.sin,
                                positions};
            append_pages(new_rows(shape, tokens, false, s, 0, length, dtype).view(),
                         new_rows(shape, tokens, true, s, 0, length, dtype).view(), slots,
                         p.pool(false), p.pool(true), rotary);
            for (Index h = 0; h < shape.heads_kv; ++h)
              for (Index t = 0; t < length; ++t) {
                std::vector<double> key(static_cast<std::size_t>(shape.dim));
                for (Index d = 0; d < shape.dim; ++d)
                  key[d] = tokens.keys[s][(h * length + t) * shape.dim + d];
                tables.rotate(key, t, style);
                for (Index d = 0; d < shape.dim; ++d)
                  ASSERT_EQ(p.element(false, s, h, t, d), rounded(key[d], dtype)) << d;
              }
          }
          // The reference over the rotated pools and queries rotated in float64.
          Tokens rotated_q = make_tokens(shape, dtype, 83);
          for (Index s = 0; s < 3; ++s) {
            const auto [length, n_q] = shape.sequences[s];
            for (Index i = 0; i < n_q; ++i)
              for (Index h = 0; h < shape.heads_q; ++h) {
                float* row = rotated_q.q.data_as<float>() +
                             ((p.query_start[s] + i) * shape.heads_q + h) * shape.dim;
                std::vector<double> q(row, row + shape.dim);
                tables.rotate(q, length - n_q + i, style);
                std::copy(q.begin(), q.end(), row);
              }
          }
          Options options;
          options.causal = true;
          const std::vector<Expected> want = reference(p, rotated_q, options);
          const Rotary rotary{style, dims == shape.dim ? 0 : dims, tables.cos, tables.sin, {}};
          const PagedOutput got = paged_attention(tokens.q.view(), p.pool(false), p.pool(true),
                                                  p.batch(), options, rotary);
          expect_matches(p, got, want);
          // The same positions given explicitly: the same bits.
          std::vector<std::int32_t> positions;
          for (Index s = 0; s < 3; ++s)
            for (Index i = 0; i < shape.sequences[s].queries; ++i)
              positions.push_back(static_cast<std::int32_t>(shape.sequences[s].length -
                                                            shape.sequences[s].queries + i));
          const Rotary given{style, rotary.dims, tables.cos, tables.sin, positions};
          EXPECT_TRUE(same_bytes(row_bits(paged_attention(tokens.q.view(), p.pool(false),
                                                          p.pool(true), p.batch(), options, given),
                                          0, 15),
                                 row_bits(got, 0, 15)));
        }
      }
    }
  }
}

TEST(Paged, BadRotaryIsRefusedNamingTheField) {
  Shape shape;
  shape.sequences = {{20, 1}, {40, 2}};
  const Tokens tokens = make_tokens(shape, CacheDType::f32, 97);
  Paged p = make_paged(shape, {CacheDType::f32, 16, PageLayout::token_major, false}, tokens, 101);
  const RotaryTables tables(30, shape.dim);
  const auto starts = [](const std::string& text, const std::string& prefix) {
    return text.rfind(prefix, 0) == 0 ? ::testing::AssertionSuccess()
                                      : ::testing::AssertionFailure() << text;
  };
  const auto attend = [&](const Rotary& rotary) {
    return error_message([&] {
      paged_attention(tokens.q.view(), p.pool(false), p.pool(true), p.batch(), {}, rotary);
    });
  };
  EXPECT_TRUE(starts(attend({RotaryStyle::neox, 7, tables.cos, tables.sin, {}}),
                     "rotary.dims: expected an even count from 2 to the head dim 40"));
  EXPECT_TRUE(starts(attend({RotaryStyle::neox, 0, std::span(tables.cos).first(5), tables.sin, {}}),
                     "rotary.cos: expected [positions, 20] values"));
  EXPECT_TRUE(
      starts(attend({RotaryStyle::neox, 0, tables.cos, std::span(tables.sin).first(20), {}}),
             "rotary.sin: expected 600 values (as cos)"));
  EXPECT_TRUE(starts(attend({RotaryStyle::none, 0, tables.cos, tables.sin, {}}),
                     "rotary.style: expected neox or interleaved"));
  // Sequence 1's queries sit at positions 38 and 39, past the tables' 30 rows.
  EXPECT_TRUE(starts(attend({RotaryStyle::neox, 0, tables.cos, tables.sin, {}}),
                     "rotary.cos: expected a row for every query's position"));
  const std::vector<std::int32_t> two{1, 2}, far{1, 2, 30};
  EXPECT_TRUE(starts(attend({RotaryStyle::neox, 0, tables.cos, tables.sin, two}),
                     "rotary.positions: expected 3 positions (one per row)"));
  EXPECT_TRUE(starts(attend({RotaryStyle::neox, 0, tables.cos, tables.sin, far}),
                     "rotary.positions: expected positions in [0, 30)"));
  const Tensor k = new_rows(shape, tokens, false, 0, 0, 2, CacheDType::f32);
  const Tensor v = new_rows(shape, tokens, true, 0, 0, 2, CacheDType::f32);
  const std::vector<std::int64_t> slots{0, 1};
  const std::vector<std::byte> before = p.key_bytes;
  EXPECT_TRUE(starts(error_message([&] {
                       append_pages(k.view(), v.view(), slots, p.pool(false), p.pool(true),
                                    {RotaryStyle::interleaved, 0, tables.cos, tables.sin, {}});
                     }),
                     "rotary.positions: expected 2 positions (one per row)"));
  EXPECT_EQ(p.key_bytes, before);
}

}  // namespace
}  // namespace attn::testing
