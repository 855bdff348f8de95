// Argument checking for attn::forward: every rejection names the argument, what was
// expected and what was given.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/argument_checks.hpp"
#include "problem.hpp"

namespace attn::core {
namespace {

void check_input(const char* name, const TensorView& t) {
  check_float_dtype(name, t.dtype);
  for (int axis = 0; axis < 4; ++axis) {
    if (t.shape[axis] < 0) fail(name, "non-negative extents", "shape " + format_dims(t.shape));
  }
  if (t.shape[1] < 1) fail(name, "at least one head", "shape " + format_dims(t.shape));
  if (t.shape[3] < 1) fail(name, "a head dim of at least 1", "shape " + format_dims(t.shape));
  check_storage(name, t);
}

std::string offsets_text(const std::vector<std::int64_t>& offsets) {
  std::string text = "[";
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(offsets[i]);
  }
  return text + "]";
}

void check_offsets(const char* name, const std::vector<std::int64_t>& offsets, Index total) {
  if (offsets.size() < 2) fail(name, "at least 2 offsets", std::to_string(offsets.size()));
  if (offsets.front() != 0) fail(name, "a first offset of 0", offsets_text(offsets));
  for (std::size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] < offsets[i - 1]) fail(name, "non-decreasing offsets", offsets_text(offsets));
  }
  if (offsets.back() != total) {
    fail(name, "a last offset equal to the packed length " + std::to_string(total),
         offsets_text(offsets));
  }
}

void add_segments(Problem& p, const Options& options) {
  const bool has_q = !options.cu_seqlens_q.empty(), has_k = !options.cu_seqlens_k.empty();
  if (has_q != has_k) {
    fail(has_q ? "cu_seqlens_k" : "cu_seqlens_q", "offsets (both or neither are given)", "none");
  }
  if (!has_q) {
    for (Index b = 0; b < p.batch; ++b) p.segments.push_back({b, 0, p.total_q, 0, p.total_k, b});
    return;
  }
  p.packed = true;
  if (p.batch != 1) {
    fail("q", "batch 1 for packed sequences (cu_seqlens given)", "shape " + format_dims(p.q.shape));
  }
  check_offsets("cu_seqlens_q", options.cu_seqlens_q, p.total_q);
  check_offsets("cu_seqlens_k", options.cu_seqlens_k, p.total_k);
  if (options.cu_seqlens_q.size() != options.cu_seqlens_k.size()) {
    fail("cu_seqlens_k", std::to_string(options.cu_seqlens_q.size()) + " offsets (as cu_seqlens_q)",
         std::to_string(options.cu_seqlens_k.size()));
  }
  for (std::size_t s = 0; s + 1 < options.cu_seqlens_q.size(); ++s) {
    const Index q0 = options.cu_seqlens_q[s], k0 = options.cu_seqlens_k[s];
    p.segments.push_back({0, q0, options.cu_seqlens_q[s + 1] - q0, k0,
                          options.cu_seqlens_k[s + 1] - k0, static_cast<Index>(s)});
  }
}

void add_mask(Problem& p, const Options& options) {
  if (!options.mask) return;
  const TensorView& m = *options.mask;
  if (p.packed) fail("mask", "no mask with packed sequences (cu_seqlens given)", "a mask");
  const Dims wanted{p.batch, p.heads_q, p.total_q, p.total_k};
  const std::string expected = "shape [" + std::to_string(p.batch) + " or 1, " +
                               std::to_string(p.heads_q) + " or 1, " + std::to_string(p.total_q) +
                               ", " + std::to_string(p.total_k) + "]";
  for (int axis = 0; axis < 4; ++axis) {
    const bool broadcast_ok = axis < 2 && m.shape[axis] == 1;
    if (m.shape[axis] != wanted[axis] && !broadcast_ok)
      fail("mask", expected, format_dims(m.shape));
  }
  check_storage("mask", m);
  p.mask = m;
  for (int axis = 0; axis < 2; ++axis) {
    if (m.shape[axis] == 1) p.mask.strides[axis] = 0;
  }
  p.mask.shape = wanted;
  p.mask_kind = m.dtype == DType::boolean ? MaskKind::boolean : MaskKind::additive;
}

// A block mask covers every segment: its batch entries are the segments (batch entries, or
// packed sequences), its rows and keys at least each segment's.
void add_block_mask(Problem& p, const Options& options) {
  if (!options.block_mask) return;
  if (options.mask) fail("block_mask", "no block mask beside a mask", "both");
  const BlockMask& m = *options.block_mask;
  const auto entries = static_cast<Index>(p.segments.size());
  if (m.batch() != entries && m.batch() != 1) {
    fail("block_mask",
         "a batch of " + std::to_string(entries) + (p.packed ? " (sequences)" : "") + " or 1",
         std::to_string(m.batch()));
  }
  if (m.heads() != p.heads_q && m.heads() != 1) {
    fail("block_mask", "heads " + std::to_string(p.heads_q) + " or 1", std::to_string(m.heads()));
  }
  Index len_q = 0, len_k = 0;
  for (const Segment& segment : p.segments) {
    len_q = std::max(len_q, segment.len_q);
    len_k = std::max(len_k, segment.len_k);
  }
  const bool fits = p.packed ? m.len_q() >= len_q && m.len_k() >= len_k
                             : m.len_q() == len_q && m.len_k() == len_k;
  if (!fits) {
    fail("block_mask",
         std::string(p.packed ? "at least " : "") + std::to_string(len_q) + " queries and " +
             (p.packed ? "at least " : "") + std::to_string(len_k) + " keys",
         std::to_string(m.len_q()) + " queries and " + std::to_string(m.len_k()) + " keys");
  }
  p.block_mask = &m;
  p.mask_kind = MaskKind::blocks;
}

}  // namespace

Problem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                     const Options& options) {
  check_input("q", q);
  check_input("k", k);
  check_input("v", v);
  Problem p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.batch = q.shape[0];
  p.heads_q = q.shape[1];
  p.total_q = q.shape[2];
  p.dim_qk = q.shape[3];
  p.heads_kv = k.shape[1];
  p.total_k = k.shape[2];
  p.dim_v = v.shape[3];

  if (k.shape[0] != p.batch || k.shape[3] != p.dim_qk) {
    fail("k",
         "shape [" + std::to_string(p.batch) + ", Hkv, Lk, " + std::to_string(p.dim_qk) +
             "] (batch and head dim of q)",
         format_dims(k.shape));
  }
  if (v.shape[0] != p.batch || v.shape[1] != p.heads_kv || v.shape[2] != p.total_k) {
    fail("v",
         "shape [" + std::to_string(p.batch) + ", " + std::to_string(p.heads_kv) + ", " +
             std::to_string(p.total_k) + ", Dv] (batch, heads and length of k)",
         format_dims(v.shape));
  }
  if (p.heads_q % p.heads_kv != 0) {
    fail("k", "a head count dividing the " + std::to_string(p.heads_q) + " query heads (GQA)",
         std::to_string(p.heads_kv) + " heads");
  }

  check_options(options, p.heads_q);
  p.rule = make_score_rule(options, p.dim_qk);
  p.sinks = options.sinks;
  p.threads = options.threads;
  p.pv_precision = options.pv_precision;
  p.dropout = make_dropout(options.dropout_p, options.dropout_seed);

  add_segments(p, options);
  add_mask(p, options);
  add_block_mask(p, options);
  if (p.rule.position_bias) p.bias_by_offset = bias_by_offset(*p.rule.position_bias, p.heads_q);
  return p;
}

void attach_outputs(Problem& p, const Outputs& outputs) {
  check_output("context", outputs.context, {p.batch, p.heads_q, p.total_q, p.dim_v});
  if (outputs.lse) {
    check_output("lse", *outputs.lse, {p.batch, p.heads_q, p.total_q, 1});
    if (outputs.lse->dtype != DType::f32 && outputs.lse->dtype != DType::f64) {
      fail("lse", "dtype float32 or float64", dtype_name(outputs.lse->dtype));
    }
  }
  if (outputs.weights) {
    check_output("weights", *outputs.weights, {p.batch, p.heads_q, p.total_q, p.total_k});
  }
  p.outputs = outputs;
}

}  // namespace attn::core
