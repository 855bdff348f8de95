// Entry points for the emulator (tests/python/emulator.py) into the shared tile core
// (src/cpu/tile/) as Highway's AVX-512 target (AVX3) compiles it: this file is built
// with that target as its only one (tests/emulated/CMakeLists.txt), so that a machine
// without AVX-512 still tests its 16-lane code: the exp, the widening, the dot micro-kernel
// and its shuffle tree, the 32-register context kernel, the rows- and keys-vectorised
// kernels, the shaper and both online softmaxes. Each entry takes its arguments as one
// struct, as in kernel_entries.cpp.
#include <hwy/highway.h>

#include <cstdint>

#include "cpu/tile/context_kernels-inl.h"
#include "cpu/tile/score_kernels-inl.h"
#include "cpu/tile/shaping-inl.h"
#include "cpu/tile/softmax-inl.h"
#include "cpu/tile/target-inl.h"

namespace hn = hwy::HWY_NAMESPACE;
namespace tile = attn::cpu::HWY_NAMESPACE::tile;
using attn::float16;
using attn::Index;

static_assert(HWY_TARGET == HWY_AVX3, "built for Highway's AVX-512 target alone");

namespace {

// out[i] = VectorExp(x[i]) for n floats, n a multiple of 16.
struct ExpArgs {
  const float* x;
  float* out;
  Index n;
};

// out[i] = float16 or bfloat16 bits in[i] widened to float32 (load_widened), n a multiple
// of 16.
struct WidenArgs {
  const std::uint16_t* in;
  float* out;
  Index n;
  int bfloat;
};

// scores_by_dot<float16, 4>: four query rows against tile::kDotKeys<4> float16 keys.
struct DotArgs {
  const float* const* q;
  const float16* const* keys;
  Index dim;
  float* const* scores;
};

// context_by_rows<float16, NR> for NR = rows (1, 2 or 4).
struct ContextArgs {
  float* const* acc;
  const float* const* p;
  const float16* const* values;
  Index first, end, dim_v;
  int rows;
};

// online_softmax_keys<true, float>: one row's `vectors` vectors of scores become weights;
// state[0], state[1] are its m and l, state[2] gets the rescale factor.
struct SoftmaxArgs {
  float* scores;
  Index vectors;
  float* state;
};

// scores_rows_vectorised<0, 3, 4> (float32): S^T for 4 keys and 3 vectors of query rows,
// as forward scores float32 tiles.
struct RowsScoresArgs {
  const float* qt;
  Index rows_stride;
  const float* const* keys;
  Index dim;
  float* out;
};

// context_rows_vectorised<3, 4>: O = O * rescale + P^T V for 4 rows and 3 vectors of columns.
struct RowsContextArgs {
  const float* p;
  Index key_stride, row_stride;
  const float* v;
  Index v_stride, keys;
  const float* rescale;
  float* o;
  Index o_stride;
};

// scores_keys_vectorised<4, 2> (backward's layout): S for 4 rows and 2 vectors of keys.
struct KeysScoresArgs {
  const float* q;
  Index q_stride;
  const float* kt;
  Index kt_stride, dim;
  float* out;
  Index out_stride;
};

// shape_scores<false, true> over one vector of keys of one row, with softcap and ALiBi.
struct ShapeArgs {
  float* x;
  const std::int32_t* key;
  std::int32_t position, first, end;
  float slope;
  double softcap;
  const float* bias;  // a position bias's values by offset key - position, bias_span of them
  std::int32_t bias_first, bias_span, bias_start;
};

// online_softmax_rows: one vector of rows over `keys` keys of P^T (stride floats apart); m,
// l and rescale are one vector each.
struct RowsSoftmaxArgs {
  float* p;
  Index keys, stride;
  float *m, *l, *rescale;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) void emulated_vector_exp(const ExpArgs* a) {
  const tile::DF df;
  for (Index i = 0; i < a->n; i += tile::lanes())
    hn::StoreU(attn::cpu::HWY_NAMESPACE::VectorExp(df, hn::LoadU(df, a->x + i)), df, a->out + i);
}

extern "C" __attribute__((visibility("default"))) void emulated_widen(const WidenArgs* a) {
  const tile::DF df;
  for (Index i = 0; i < a->n; i += tile::lanes()) {
    const auto widened =
        a->bfloat ? tile::load_floats(df, reinterpret_cast<const attn::bfloat16*>(a->in + i))
                  : tile::load_floats(df, reinterpret_cast<const float16*>(a->in + i));
    hn::StoreU(widened, df, a->out + i);
  }
}

extern "C" __attribute__((visibility("default"))) int emulated_dot_keys() {
  return tile::kDotKeys<4>;
}

extern "C" __attribute__((visibility("default"))) void emulated_scores_by_dot(const DotArgs* a) {
  tile::scores_by_dot<4>(a->q, a->keys, a->dim, a->scores);
}

extern "C" __attribute__((visibility("default"))) void emulated_context_by_rows(
    const ContextArgs* a) {
  if (a->rows == 4)
    return tile::context_by_rows<4>(a->acc, a->p, a->values, a->first, a->end, a->dim_v);
  if (a->rows == 2)
    return tile::context_by_rows<2>(a->acc, a->p, a->values, a->first, a->end, a->dim_v);
  tile::context_by_rows<1>(a->acc, a->p, a->values, a->first, a->end, a->dim_v);
}

extern "C" __attribute__((visibility("default"))) void emulated_online_softmax(
    const SoftmaxArgs* a) {
  const tile::RowUpdate update =
      tile::online_softmax_keys<true>(a->scores, a->vectors, a->state[0], a->state[1]);
  a->state[2] = update.rescale;
}

extern "C" __attribute__((visibility("default"))) void emulated_scores_rows_vectorised(
    const RowsScoresArgs* a) {
  tile::scores_rows_vectorised<0, 3, 4>(a->qt, a->rows_stride, a->keys, a->dim, a->out);
}

extern "C" __attribute__((visibility("default"))) void emulated_context_rows_vectorised(
    const RowsContextArgs* a) {
  tile::context_rows_vectorised<3, 4>(a->p, a->key_stride, a->row_stride, a->v, a->v_stride,
                                      a->keys, a->rescale, a->o, a->o_stride);
}

extern "C" __attribute__((visibility("default"))) void emulated_scores_keys_vectorised(
    const KeysScoresArgs* a) {
  tile::scores_keys_vectorised<4, 2>(a->q, a->q_stride, a->kt, a->kt_stride, a->dim, a->out,
                                     a->out_stride);
}

extern "C" __attribute__((visibility("default"))) void emulated_shape_scores(const ShapeArgs* a) {
  const tile::DF df;
  const tile::DI di;
  attn::core::BiasByOffset bias;
  bias.values.assign(a->bias, a->bias + a->bias_span);
  bias.first = a->bias_first;
  bias.span = a->bias_span;
  const tile::ScoreShaping shaping(a->softcap, true, bias);
  const tile::VF shaped = tile::shape_scores<true>(
      shaping, hn::LoadU(df, a->x), hn::LoadU(di, a->key), hn::Set(di, a->position),
      hn::Set(df, a->slope), hn::Set(di, a->bias_start), hn::Set(di, a->first),
      hn::Set(di, a->end));
  hn::StoreU(shaped, df, a->x);
}

extern "C" __attribute__((visibility("default"))) void emulated_online_softmax_rows(
    const RowsSoftmaxArgs* a) {
  tile::online_softmax_rows(a->p, a->keys, a->stride, a->m, a->l, a->rescale);
}
