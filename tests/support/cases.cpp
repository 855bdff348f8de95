#include "cases.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include "attn/half.hpp"
#include "core/rows.hpp"

namespace attn::testing {

std::string Case::name() const {
  std::ostringstream out;
  out << "B" << batch << "_H" << heads_q << "x" << heads_kv << "_Lq" << len_q << "_Lk" << len_k
      << "_D" << dim;
  if (dim_v != dim) out << "_Dv" << dim_v;
  if (causal) out << (align == CausalAlign::top_left ? "_causalTL" : "_causalBR");
  if (!causal && align == CausalAlign::bottom_right) out << "_alignBR";
  if (window.left >= 0 || window.right >= 0) {
    auto bound = [](Index b) { return b < 0 ? std::string("inf") : std::to_string(b); };
    out << "_win" << bound(window.left) << "_" << bound(window.right);
  }
  if (softcap > 0) out << "_softcap" << softcap;
  if (alibi) out << "_alibi";
  if (sinks) out << "_sinks";
  if (position_bias == BiasBuckets::clipped) out << "_biasclipped";
  if (position_bias == BiasBuckets::t5) out << "_biast5";
  if (position_bias == BiasBuckets::t5_causal) out << "_biast5causal";
  if (mask == MaskCase::boolean) out << "_boolmask";
  if (mask == MaskCase::additive) out << "_addmask";
  if (packed) out << "_packed";
  if (dtype != DType::f32) out << "_" << dtype_name(dtype);
  if (bshd) out << "_bshd";
  if (dropout > 0) out << "_dropout" << dropout;
  // The name is also a gtest parameter name, which allows only letters, digits and '_'.
  std::string name = out.str();
  for (char& ch : name) {
    if (ch == '.') ch = 'p';
    if (ch == '-') ch = 'm';
  }
  return name;
}

void PrintTo(const Case& c, std::ostream* out) {
  *out << c.name();
}

namespace {

struct Shape {
  Index batch, heads_q, heads_kv, len_q, len_k, dim, dim_v;
};

Case with_shape(const Shape& s) {
  Case c;
  c.batch = s.batch;
  c.heads_q = s.heads_q;
  c.heads_kv = s.heads_kv;
  c.len_q = s.len_q;
  c.len_k = s.len_k;
  c.dim = s.dim;
  c.dim_v = s.dim_v;
  return c;
}

// Every option on its own, then a few together, on one shape.
void add_option_cases(const Shape& shape, std::vector<Case>& out) {
  const Case base = with_shape(shape);
  auto add = [&](auto&& edit) {
    Case c = base;
    edit(c);
    out.push_back(c);
  };
  add([](Case&) {});
  add([](Case& c) { c.causal = true; });
  add([](Case& c) { c.causal = true, c.align = CausalAlign::bottom_right; });
  add([](Case& c) { c.window = {4, 0}; });
  add([](Case& c) { c.window = {3, 5}, c.align = CausalAlign::bottom_right; });
  add([](Case& c) { c.softcap = 5.0; });
  add([](Case& c) { c.alibi = true; });
  add([](Case& c) { c.sinks = true; });
  add([](Case& c) { c.position_bias = BiasBuckets::t5; });
  add([](Case& c) { c.mask = MaskCase::boolean; });
  add([](Case& c) { c.mask = MaskCase::additive; });
  add([](Case& c) { c.bshd = true; });
  add([](Case& c) { c.dtype = DType::f16; });
  add([](Case& c) { c.dtype = DType::bf16; });
  add([](Case& c) { c.dtype = DType::f64; });
  if (shape.batch == 1) {
    add([](Case& c) { c.packed = true; });
    add([](Case& c) { c.packed = true, c.causal = true, c.align = CausalAlign::bottom_right; });
  }
  add([](Case& c) {
    c.causal = true, c.align = CausalAlign::bottom_right, c.window = {6, -1};
    c.softcap = 3.0, c.alibi = true, c.sinks = true, c.mask = MaskCase::additive;
    c.position_bias = BiasBuckets::clipped;
  });
  add([](Case& c) {
    c.causal = true, c.softcap = 8.0, c.alibi = true, c.mask = MaskCase::boolean, c.bshd = true;
    c.position_bias = BiasBuckets::t5_causal;
  });
}

// The head dims with their own copy of the forward kernel (with_head_dim in
// src/cpu/forward/forward.cpp), on a shape whose rows see keys in more than one key tile (128
// keys a tile, 64 at d = 256, 256 where AMX scores bf16 at d = 128): 37 query rows against
// 300 keys, or 150 at d = 256.
constexpr Index kSpecialisedDims[] = {64, 80, 96, 128, 256};

Shape specialised_shape(Index dim) {
  return {1, 4, 2, 37, dim >= 256 ? 150 : 300, dim, dim};
}

// A few cases that together turn every option on, with windows and causal alignment that
// leave each row keys in more than one tile.
void add_rich_cases(const Shape& shape, std::vector<Case>& out) {
  const Case base = with_shape(shape);
  const Index half = shape.len_k / 2;
  auto add = [&](auto&& edit) {
    Case c = base;
    edit(c);
    out.push_back(c);
  };
  add([&](Case& c) {
    c.causal = true, c.align = CausalAlign::bottom_right, c.window = {half, -1};
    c.softcap = 3.0, c.alibi = true, c.sinks = true, c.mask = MaskCase::additive;
    c.position_bias = BiasBuckets::t5;
  });
  add([&](Case& c) {
    c.window = {half, 5}, c.align = CausalAlign::bottom_right, c.softcap = 8.0;
    c.mask = MaskCase::boolean, c.bshd = true, c.dtype = DType::f16;
    c.position_bias = BiasBuckets::t5_causal;
  });
  // Packing splits the keys into sequences of 2/5, 2/5 and 1/5 of them: twice the keys
  // leave the first two sequences more than one tile.
  add([](Case& c) {
    c.len_k *= 2;
    c.packed = true, c.causal = true, c.align = CausalAlign::bottom_right, c.sinks = true;
    c.dtype = DType::bf16, c.position_bias = BiasBuckets::clipped;
  });
}

// Rows scored by the dot micro-kernel (a chunk of at most half a vector of rows: 3 rows
// on AVX2 and AVX-512, 2 on SSE4) at head dims 17 to 31, so that every tail length
// dim % 16 from 1 to 15 (and so every dim % 8 and dim % 4) is reached on every target,
// in every dtype: the scalar tail after the whole vectors of d is where two compiled copies
// of one kernel may round differently.
void add_narrow_row_cases(std::vector<Case>& out) {
  for (Index tail = 1; tail < 16; ++tail) {
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      const Index dim = 16 + tail;
      Case rows3 = with_shape({1, 2, 2, 3, 97, dim, dim});
      rows3.dtype = dtype;
      if (tail % 2 == 1) rows3.causal = true, rows3.align = CausalAlign::bottom_right;
      out.push_back(rows3);
      Case rows2 = with_shape({1, 2, 1, 1, 97, dim, dim});
      rows2.dtype = dtype;
      out.push_back(rows2);
    }
  }
}

}  // namespace

std::vector<Case> quick_cases() {
  const Shape shapes[] = {
      {2, 4, 2, 17, 17, 40, 40},  {1, 2, 2, 3, 97, 59, 59}, {1, 3, 1, 113, 97, 72, 72},
      {2, 2, 1, 1, 113, 256, 40}, {1, 2, 1, 97, 1, 1, 3},   {1, 1, 1, 1, 1, 1, 1},
  };
  std::vector<Case> out;
  for (const Shape& s : shapes) add_option_cases(s, out);
  for (const Index dim : kSpecialisedDims) add_rich_cases(specialised_shape(dim), out);
  add_narrow_row_cases(out);
  return out;
}

std::vector<Case> full_cases() {
  std::vector<Case> out = quick_cases();
  for (const Index dim : kSpecialisedDims) add_option_cases(specialised_shape(dim), out);
  const Index lengths[] = {1, 3, 17, 97, 113, 1025};
  const Index dims[] = {1, 40, 59, 64, 72, 128, 256};
  for (const Index len_q : lengths) {
    for (const Index len_k : lengths) {
      for (const Index dim : dims) {
        if (len_q * len_k * dim > 1025 * 1025 * 64) continue;  // keep the float64 oracle quick
        add_option_cases({1, 4, 2, len_q, len_k, dim, dim}, out);
      }
    }
  }
  return out;
}

bool full_sweep() {
  const char* full = std::getenv("ATTN_FULL_SWEEP");
  return full != nullptr && full[0] == '1';
}

std::vector<Case> case_list() {
  return full_sweep() ? full_cases() : quick_cases();
}

std::vector<Case> dropout_cases() {
  std::vector<Case> out = case_list();
  for (Case& c : out) c.dropout = 0.3;
  return out;
}

namespace {

// An owning tensor in [b, h, s, d] or [b, s, h, d] storage, with its [b, h, s, d] view.
TensorView fill_random(const Dims& bhsd, DType dtype, bool bshd, std::mt19937_64& rng,
                       Tensor& storage) {
  const Dims stored = bshd ? Dims{bhsd[0], bhsd[2], bhsd[1], bhsd[3]} : bhsd;
  storage = Tensor(dtype, stored);
  std::normal_distribution<double> normal(0.0, 1.0);
  const MutableTensorView flat = storage.mutable_view();
  std::vector<double> row(static_cast<std::size_t>(stored[3]));
  for (Index b = 0; b < stored[0]; ++b)
    for (Index h = 0; h < stored[1]; ++h)
      for (Index s = 0; s < stored[2]; ++s) {
        for (double& x : row) x = normal(rng);
        core::store_row(flat, b, h, s, row.data());
      }
  return TensorView(storage.data(), dtype, bhsd,
                    bshd ? bshd_strides(bhsd) : contiguous_strides(bhsd));
}

// Splits `total` rows into three uneven packed sequences (one may be empty).
std::vector<std::int64_t> packed_offsets(Index total, Index shift) {
  const Index a = (total * (1 + shift)) / 5, b = a + (total * 2) / 5;
  return {0, a, std::min(b, total), total};
}

}  // namespace

Inputs make_inputs(const Case& c, unsigned seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.q = fill_random({c.batch, c.heads_q, c.len_q, c.dim}, c.dtype, c.bshd, rng, in.q_storage);
  in.k = fill_random({c.batch, c.heads_kv, c.len_k, c.dim}, c.dtype, c.bshd, rng, in.k_storage);
  in.v = fill_random({c.batch, c.heads_kv, c.len_k, c.dim_v}, c.dtype, c.bshd, rng, in.v_storage);
  Options& o = in.options;
  o.causal = c.causal;
  o.causal_align = c.align;
  o.window = c.window;
  o.softcap = c.softcap;
  o.dropout_p = c.dropout;
  o.dropout_seed = 0x5EED0000u + seed;
  // The case lists hold float32 P to float32's bounds; P rounded to bf16, the default for
  // bf16 V, has tests of its own (cpu_forward_test.cpp, test_low_precision_accuracy.py).
  o.pv_precision = PvPrecision::exact;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  if (c.alibi) {
    for (Index h = 0; h < c.heads_q; ++h)
      o.alibi_slopes.push_back(std::exp2(-8.0 * (h + 1) / c.heads_q));
  }
  if (c.sinks) {
    for (Index h = 0; h < c.heads_q; ++h)
      o.sinks.push_back(static_cast<float>(uniform(rng) * 2.0 - 1.0));
  }
  if (c.position_bias) {
    PositionBias& bias = o.position_bias.emplace();
    bias.buckets = *c.position_bias;
    const bool clipped = bias.buckets == BiasBuckets::clipped;
    bias.columns = clipped ? 33 : bias.buckets == BiasBuckets::t5 ? 32 : 16;
    bias.offset = clipped ? 16 : 0;
    bias.max_distance = bias.buckets == BiasBuckets::t5 ? 40 : 24;
    const Index rows = clipped ? 1 : c.heads_q;
    for (Index i = 0; i < rows * bias.columns; ++i) bias.table.push_back(uniform(rng) * 4.0 - 2.0);
  }
  if (c.mask != MaskCase::none) {
    // Broadcast over heads; about one key in five hidden, some rows hidden entirely.
    const Dims shape{c.batch, 1, c.len_q, c.len_k};
    const bool boolean = c.mask == MaskCase::boolean;
    in.mask_storage = Tensor(boolean ? DType::boolean : DType::f32, shape);
    for (Index b = 0; b < c.batch; ++b)
      for (Index i = 0; i < c.len_q; ++i) {
        const bool row_hidden = c.len_q > 2 && i % 7 == 2;
        for (Index j = 0; j < c.len_k; ++j) {
          const bool hide = row_hidden || uniform(rng) < 0.2;
          const Index at = (b * c.len_q + i) * c.len_k + j;
          if (boolean) {
            in.mask_storage.data_as<bool>()[at] = !hide;
          } else {
            in.mask_storage.data_as<float>()[at] =
                hide ? -INFINITY : static_cast<float>(-2.0 * uniform(rng));
          }
        }
      }
    o.mask = in.mask_storage.view();
  }
  if (c.packed) {
    o.cu_seqlens_q = packed_offsets(c.len_q, 0);
    o.cu_seqlens_k = packed_offsets(c.len_k, 1);
  }
  return in;
}

namespace {

template <class T>
void poison_rows(Inputs& in, Index key, T nan, T infinity) {
  auto* k = static_cast<T*>(const_cast<void*>(in.k.data));
  auto* v = static_cast<T*>(const_cast<void*>(in.v.data));
  for (Index b = 0; b < in.k.shape[0]; ++b)
    for (Index h = 0; h < in.k.shape[1]; ++h) {
      T* k_row = k + b * in.k.strides[0] + h * in.k.strides[1] + key * in.k.strides[2];
      T* v_row = v + b * in.v.strides[0] + h * in.v.strides[1] + key * in.v.strides[2];
      k_row[0] = nan;
      v_row[in.v.shape[3] - 1] = infinity;
    }
}

}  // namespace

void poison_key(Inputs& in, Index key) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInfinity = std::numeric_limits<float>::infinity();
  if (in.k.dtype == DType::bf16) {
    return poison_rows(in, key, to_bfloat16(kNan), to_bfloat16(kInfinity));
  }
  if (in.k.dtype == DType::f16)
    return poison_rows(in, key, to_float16(kNan), to_float16(kInfinity));
  poison_rows(in, key, kNan, kInfinity);
}

void show_key_to_every_fourth_row(Inputs& in, Index key) {
  const Dims& shape = in.mask_storage.shape();
  for (Index b = 0; b < shape[0]; ++b)
    for (Index i = 0; i < shape[2]; ++i) {
      const bool shown = i % 4 == 0;
      const Index at = (b * shape[2] + i) * shape[3] + key;
      if (in.mask_storage.dtype() == DType::boolean) {
        in.mask_storage.data_as<bool>()[at] = shown;
      } else {
        in.mask_storage.data_as<float>()[at] = shown ? 0.0f : -INFINITY;
      }
    }
}

}  // namespace attn::testing
