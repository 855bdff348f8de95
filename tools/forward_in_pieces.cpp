#include "forward_in_pieces.hpp"

#include <cstddef>
#include <type_traits>
#include <vector>

namespace attn::tools {
namespace {

// Past this many batch entries a piece takes a whole entry: thousands of one-head calls
// would cost more in per-call set-up than progress is worth.
constexpr Index kManyBatchEntries = 16;

// Heads [head, head + heads) of batch entry `batch`; a dim of extent 1 is broadcast and
// stays as it is.
template <class View>
View slice(const View& view, Index batch, Index head, Index heads) {
  View part = view;
  std::ptrdiff_t offset = 0;
  if (view.shape[0] > 1) {
    offset += batch * view.strides[0];
    part.shape[0] = 1;
  }
  if (view.shape[1] > 1) {
    offset += head * view.strides[1];
    part.shape[1] = heads;
  }
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(view.data)>>,
                                  const char, char>;
  part.data =
      static_cast<Byte*>(view.data) + offset * static_cast<std::ptrdiff_t>(dtype_size(view.dtype));
  return part;
}

// Heads [head, head + heads) of per-head values of `width` each (all of them when they are
// one row for every head).
template <class T>
std::vector<T> per_head(const std::vector<T>& values, Index head, Index heads, Index width = 1) {
  if (values.empty() || static_cast<Index>(values.size()) == width) return values;
  return {values.begin() + head * width, values.begin() + (head + heads) * width};
}

}  // namespace

Index count_pieces(const TensorView& q, const TensorView& k) {
  const Index batch = q.shape[0];
  return batch >= kManyBatchEntries ? batch : batch * k.shape[1];
}

void forward_in_pieces(const TensorView& q, const TensorView& k, const TensorView& v,
                       const Options& options, const Outputs& outputs,
                       const ProgressCallback& progress) {
  check_forward(q, k, v, options, outputs);
  const Index batch = q.shape[0], heads_kv = k.shape[1], group = q.shape[1] / heads_kv;
  const bool whole_entries = batch >= kManyBatchEntries;
  const Index kv_step = whole_entries ? heads_kv : 1;
  const Index total = count_pieces(q, k);
  Index done = 0;
  progress(done, total);
  for (Index b = 0; b < batch; ++b) {
    for (Index g = 0; g < heads_kv; g += kv_step) {
      const Index head_q = g * group, heads_q = kv_step * group;
      Options part = options;
      part.alibi_slopes = per_head(options.alibi_slopes, head_q, heads_q);
      part.sinks = per_head(options.sinks, head_q, heads_q);
      if (PositionBias* bias = part.position_bias ? &*part.position_bias : nullptr) {
        bias->table = per_head(bias->table, head_q, heads_q, bias->columns);
      }
      if (options.mask) part.mask = slice(*options.mask, b, head_q, heads_q);
      Outputs out{slice(outputs.context, b, head_q, heads_q), std::nullopt, std::nullopt};
      if (outputs.lse) out.lse = slice(*outputs.lse, b, head_q, heads_q);
      if (outputs.weights) out.weights = slice(*outputs.weights, b, head_q, heads_q);
      forward_into(slice(q, b, head_q, heads_q), slice(k, b, g, kv_step), slice(v, b, g, kv_step),
                   part, out);
      progress(++done, total);
    }
  }
}

}  // namespace attn::tools
