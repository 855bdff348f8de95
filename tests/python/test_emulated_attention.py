"""The attention kernels as Highway's AVX-512 target compiles them (src/cpu/forward/forward.cpp,
weights.cpp and backward.cpp, built by tests/emulated with a one-thread runtime), run on an
emulated Sapphire Rapids (tests/python/emulator.py) over a case list, against float64 with
the C++ suites' bounds: NaN and infinities, then guard floats around each output, then NMSE
and max abs error. bf16 q and k take forward's AVX512-BF16 scores there (the CPU reports
AVX512-BF16; BochsCPU has no AMX, so the AMX kernels, bf16's and fp16's, run on the model
of tests/cpu_amx_test.cpp and cpu_fp16_parts_test.cpp instead). The same kernels run
natively through attn wherever the CPU has AVX-512; this runs them everywhere."""

import struct

import ml_dtypes
import numpy as np
import pytest

import attn
import numpy_reference

# tests/cpu_forward_test.cpp, weights_test.cpp and backward_test.cpp.
CONTEXT_NMSE, LSE_MAX_ABS, WEIGHTS_MAX_ABS, GRADIENT_NMSE = 2e-12, 2e-5, 1e-5, 2e-11
GUARD = np.float32(-1.5e38)
DTYPES = {"float32": 2, "bfloat16": 1, "float16": 0}  # attn::DType
NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _stored(x, dtype):
    """The bytes attn reads for x in dtype, and their values in float64."""
    x = np.ascontiguousarray(x, NUMPY_DTYPES[dtype])
    return x.tobytes(), x.astype(np.float64)


def _guarded(emulator, count):
    """An output of count floats between two runs of 16 guard floats; its address."""
    at = emulator.put(np.full(count + 32, GUARD, np.float32).tobytes())
    return at + 64


def _read(emulator, at, count):
    raw = np.frombuffer(emulator.read(at - 64, 4 * (count + 32)), np.float32)
    assert np.all(raw[:16] == GUARD) and np.all(raw[16 + count:] == GUARD), "guards overwritten"
    return raw[16:16 + count].astype(np.float64)


def _nmse(got, want):
    return np.sum((got - want) ** 2) / np.sum(want ** 2)


class _Case:
    """One case's inputs in the emulator's data area, and its float64 oracle."""

    def __init__(self, emulator, dtype, batch, heads_q, heads_kv, len_q, len_k, dim, causal,
                 dropout_p=0.0, pv_precision=0):
        rng = np.random.default_rng(len_q * 1000 + len_k + dim)
        self.emulator, self.dtype, self.causal = emulator, dtype, causal
        self.dropout_p, self.dropout_seed = dropout_p, 777
        self.pv_precision = pv_precision  # attn::PvPrecision: 0 exact, 1 bf16
        self.shape = (batch, heads_q, heads_kv, len_q, len_k, dim)
        q_bytes, self.q = _stored(rng.standard_normal((batch, heads_q, len_q, dim)), dtype)
        k_bytes, self.k = _stored(rng.standard_normal((batch, heads_kv, len_k, dim)), dtype)
        v_bytes, self.v = _stored(rng.standard_normal((batch, heads_kv, len_k, dim)), dtype)
        self.scale = 1 / np.sqrt(dim)
        self.want, self.want_lse, self.want_weights = numpy_reference.attention(
            self.q, self.k, self.v, causal=causal, scale=self.scale)
        # Dropout's factor per weight (attn.dropout_mask, the scalar rule) and the context
        # it gives; the weights and lse stay the softmax's.
        self.factor = np.ones_like(self.want_weights)
        if dropout_p:
            kept = attn.dropout_mask(self.want_weights.shape, dropout_p, self.dropout_seed)
            self.factor = np.where(kept, 1 / (1 - dropout_p), 0.0)
            group = heads_q // heads_kv
            self.want = np.einsum("bhqk,bhkd->bhqd", self.want_weights * self.factor,
                                  np.repeat(self.v, group, axis=1))
        emulator.reset_data()
        self.q_at, self.k_at, self.v_at = (emulator.put(b) for b in (q_bytes, k_bytes, v_bytes))
        self.rows = batch * heads_q * len_q

    def call(self, entry, context=0, lse=0, weights=0, lse64=0, out=0, dout=0, dq=0, dk=0,
             dv=0):
        batch, heads_q, heads_kv, len_q, len_k, dim = self.shape
        args = struct.pack("<QQQiiqqqqqqqdQQQQQQQQQdQi", self.q_at, self.k_at, self.v_at,
                           DTYPES[self.dtype], int(self.causal), batch, heads_q, heads_kv, len_q,
                           len_k, dim, dim, self.scale, context, lse, weights, lse64, out, dout,
                           dq, dk, dv, self.dropout_p, self.dropout_seed, self.pv_precision)
        self.emulator.call(entry, self.emulator.put(args))


# (batch, query heads, kv heads, len q, len k, head dim, causal, weights): the head-dim
# copies (64, 128 and the generic copy), grouped queries, tiles past one, a decoding row.
CASES = [(1, 2, 2, 33, 47, 64, False, False), (1, 4, 2, 70, 130, 128, True, False),
         (2, 2, 1, 17, 200, 40, False, True), (1, 4, 4, 1, 160, 64, False, False),
         (1, 2, 2, 96, 96, 80, True, True)]


# Rows the dot micro-kernel scores (3 or 2 rows per KV head: at most half a vector) at head
# dims 17 to 31, so that every tail length dim % 16 from 1 to 15 is reached.
NARROW_CASES = [(1, 2, 2, 3, 97, 16 + tail, tail % 2 == 1, True) for tail in range(1, 16)] + [
    (1, 2, 1, 1, 97, 16 + tail, False, True) for tail in range(1, 16)]


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, heads_q, heads_kv, len_q, len_k, dim, causal, weights",
                         CASES + NARROW_CASES[::6])
def test_forward_matches_float64(emulator, dtype, batch, heads_q, heads_kv, len_q, len_k, dim,
                                 causal, weights, dropout_p):
    """Forward's context, lse and kept float32 weights; with dropout, the context of the
    dropped weights (attn.dropout_mask's), the lse and weights those before dropout."""
    case = _Case(emulator, dtype, batch, heads_q, heads_kv, len_q, len_k, dim, causal, dropout_p)
    n_weights = case.rows * len_k
    context_at, lse_at = _guarded(emulator, case.rows * dim), _guarded(emulator, case.rows)
    weights_at = _guarded(emulator, n_weights) if weights else 0
    case.call("emulated_forward", context=context_at, lse=lse_at, weights=weights_at)
    context = _read(emulator, context_at, case.rows * dim)
    lse = _read(emulator, lse_at, case.rows)
    assert np.all(np.isfinite(context)) and np.all(np.isfinite(lse))
    assert _nmse(context, case.want.ravel()) < CONTEXT_NMSE
    assert np.abs(lse - case.want_lse.ravel()).max() < LSE_MAX_ABS
    if weights:
        got = _read(emulator, weights_at, n_weights)
        assert np.all(np.isfinite(got))
        assert np.abs(got - case.want_weights.ravel()).max() < WEIGHTS_MAX_ABS


POISONED_KEY = 50  # causal hides it from the rows before it


@pytest.mark.parametrize(
    "poisoned, batch, heads_q, heads_kv, len_q, len_k, dim, causal, weights",
    [(poisoned,) + case for case in CASES if case[3] * case[1] // case[2] >= 64
     for poisoned in (False, True)] +
    [(False, 1, 4, 4, 1, 160, 64, False, False), (False, 1, 8, 2, 1, 300, 128, False, True)])
def test_forward_with_p_rounded_to_bf16(emulator, poisoned, batch, heads_q, heads_kv, len_q,
                                        len_k, dim, causal, weights):
    """pv_precision bf16 on bf16 inputs (items of 64 rows or more per KV head: P V by
    vdpbf16ps on V^T, src/cpu/bf16_dot.cpp; decoding rows, narrow chunks: on V rows paired
    key by key, src/cpu/tile/bf16_pairs-inl.h), each weight rounded to bf16, so each context
    element is off float64's by at most 2^-8 of sum_k w_k |v_k| (bf16's unit roundoff) and
    differs from exact P's; lse and kept weights stay exact. A NaN in one value row reaches only the
    rows that see it (its span of keys goes key by key, P exact)."""
    case = _Case(emulator, "bfloat16", batch, heads_q, heads_kv, len_q, len_k, dim, causal)
    if poisoned:
        for head in range(batch * heads_kv):
            emulator.write(case.v_at + ((head * len_k + POISONED_KEY) * dim + 3) * 2,
                           np.array([np.nan], ml_dtypes.bfloat16).tobytes())
    n_weights = case.rows * len_k
    outputs = {}
    for pv_precision in (0, 1):
        case.pv_precision = pv_precision
        context_at, lse_at = _guarded(emulator, case.rows * dim), _guarded(emulator, case.rows)
        weights_at = _guarded(emulator, n_weights) if weights else 0
        case.call("emulated_forward", context=context_at, lse=lse_at, weights=weights_at)
        outputs[pv_precision] = (_read(emulator, context_at, case.rows * dim),
                                 _read(emulator, lse_at, case.rows),
                                 _read(emulator, weights_at, n_weights) if weights else None)
    context, lse, kept = outputs[1]
    group = heads_q // heads_kv
    magnitude = np.einsum("bhqk,bhkd->bhqd", case.want_weights,
                          np.abs(np.repeat(case.v, group, axis=1))).ravel()
    seen = np.ones(case.want.shape, bool)
    if poisoned:
        sees = case.want_weights[..., POISONED_KEY] > 0
        assert sees.any() and not sees.all()
        assert np.all(np.isnan(context.reshape(case.want.shape)[sees][:, 3]))
        seen[sees] = False
    seen = seen.ravel()
    assert np.all(np.isfinite(context[seen])) and np.all(np.isfinite(lse))
    error = np.abs(context - case.want.ravel())[seen]
    assert np.all(error <= 2.0 ** -8 * magnitude[seen] + 1e-6)
    if not poisoned:  # a poisoned value's span of keys keeps exact P (key by key)
        assert not np.array_equal(context, outputs[0][0])
    assert np.array_equal(lse, outputs[0][1])
    if weights:
        assert np.array_equal(kept, outputs[0][2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("poisoned", ["k", "v"])
@pytest.mark.parametrize("batch, heads_q, heads_kv, len_q, len_k, dim, causal, _",
                         [case for case in CASES if case[6]])
def test_forward_nan_reaches_only_the_rows_that_see_it(emulator, dtype, poisoned, batch, heads_q,
                                                       heads_kv, len_q, len_k, dim, causal, _):
    """NaN at d = 3 of one key row (every row that sees it NaN) or one value row (their
    context's d = 3 NaN), in every KV head: the rows it is hidden from keep their context.
    Where the CPU has AMX, fp16 scores rescore a key that is not finite from its parts, and a
    value block that is not finite goes key by key."""
    case = _Case(emulator, dtype, batch, heads_q, heads_kv, len_q, len_k, dim, causal)
    numpy_dtype = np.dtype(NUMPY_DTYPES[dtype])
    at = case.k_at if poisoned == "k" else case.v_at
    for head in range(batch * heads_kv):
        emulator.write(at + ((head * len_k + POISONED_KEY) * dim + 3) * numpy_dtype.itemsize,
                       np.array([np.nan], numpy_dtype).tobytes())
    context_at, lse_at = _guarded(emulator, case.rows * dim), _guarded(emulator, case.rows)
    case.call("emulated_forward", context=context_at, lse=lse_at)
    context = _read(emulator, context_at, case.rows * dim).reshape(case.want.shape)
    sees = case.want_weights[..., POISONED_KEY] > 0
    assert sees.any() and not sees.all()
    poisoned_dims = slice(None) if poisoned == "k" else slice(3, 4)
    assert np.all(np.isnan(context[sees][:, poisoned_dims]))
    if poisoned == "v":
        assert np.all(np.isfinite(np.delete(context[sees], 3, axis=1)))
    assert np.all(np.isfinite(context[~sees]))
    assert _nmse(context[~sees], case.want[~sees]) < CONTEXT_NMSE


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, heads_q, heads_kv, len_q, len_k, dim, causal, _", CASES)
def test_weights_match_float64(emulator, dtype, batch, heads_q, heads_kv, len_q, len_k, dim,
                               causal, _):
    """The weights kernel (src/cpu/weights/weights.cpp), its own two passes over the keys."""
    case = _Case(emulator, dtype, batch, heads_q, heads_kv, len_q, len_k, dim, causal)
    weights_at = _guarded(emulator, case.rows * len_k)
    case.call("emulated_weights", weights=weights_at)
    got = _read(emulator, weights_at, case.rows * len_k)
    assert np.all(np.isfinite(got))
    assert np.abs(got - case.want_weights.ravel()).max() < WEIGHTS_MAX_ABS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, heads_q, heads_kv, len_q, len_k, dim, causal, _",
                         CASES + NARROW_CASES)
def test_weights_are_forward_weights_bits(emulator, dtype, batch, heads_q, heads_kv, len_q,
                                          len_k, dim, causal, _):
    """The weights pass on its own sums each row's lse by the walk forward runs, and forward
    keeps its float32 weights from the same scores: both score each chunk by the kernel the
    plan names (bf16: the same AVX512-BF16 dot products), so both give the same float32 bits,
    and forward's context and weights match float64."""
    case = _Case(emulator, dtype, batch, heads_q, heads_kv, len_q, len_k, dim, causal)
    n_weights = case.rows * len_k
    context_at, lse_at = _guarded(emulator, case.rows * dim), _guarded(emulator, case.rows)
    forward_at, alone_at = _guarded(emulator, n_weights), _guarded(emulator, n_weights)
    case.call("emulated_forward", context=context_at, lse=lse_at, weights=forward_at)
    case.call("emulated_weights", weights=alone_at)
    forward, alone = _read(emulator, forward_at, n_weights), _read(emulator, alone_at, n_weights)
    assert np.array_equal(forward.astype(np.float32).view(np.uint32),
                          alone.astype(np.float32).view(np.uint32))
    assert np.abs(alone - case.want_weights.ravel()).max() < WEIGHTS_MAX_ABS
    context = _read(emulator, context_at, case.rows * dim)
    assert _nmse(context, case.want.ravel()) < CONTEXT_NMSE


def _gradients(case, out, dout):
    """dq, dk, dv in float64 from the definitions, with the stored out and dout the kernel
    reads (D = rowsum(dout * out)) and dropout's factor z (1 without dropout)."""
    group = case.shape[1] // case.shape[2]
    k, v = np.repeat(case.k, group, axis=1), np.repeat(case.v, group, axis=1)
    p, z = case.want_weights, case.factor
    d = np.sum(dout * out, axis=-1, keepdims=True)
    ds = p * (z * np.einsum("bhqd,bhkd->bhqk", dout, v) - d)
    dq = case.scale * np.einsum("bhqk,bhkd->bhqd", ds, k)
    dk = case.scale * np.einsum("bhqk,bhqd->bhkd", ds, case.q)
    dv = np.einsum("bhqk,bhqd->bhkd", p * z, dout)
    fold = lambda g: g.reshape(g.shape[0], -1, group, *g.shape[2:]).sum(axis=2)  # noqa: E731
    return dq, fold(dk), fold(dv)


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, heads_q, heads_kv, len_q, len_k, dim, causal, _", CASES)
def test_backward_matches_float64(emulator, dtype, batch, heads_q, heads_kv, len_q, len_k, dim,
                                  causal, _, dropout_p):
    """The backward kernel (src/cpu/backward/backward.cpp) from the oracle's out and lse (float32) and
    a dout, stored in the inputs' dtype; with dropout, the oracle's out is the dropped one."""
    case = _Case(emulator, dtype, batch, heads_q, heads_kv, len_q, len_k, dim, causal, dropout_p)
    rng = np.random.default_rng(dim)
    out_bytes, out = _stored(case.want, dtype)
    dout_bytes, dout = _stored(rng.standard_normal(case.want.shape), dtype)
    want = _gradients(case, out, dout)
    sizes = [case.q.size, case.k.size, case.v.size]
    out_at, dout_at = emulator.put(out_bytes), emulator.put(dout_bytes)
    lse_at = emulator.put(case.want_lse.astype(np.float32).tobytes())
    grads_at = [_guarded(emulator, n) for n in sizes]
    case.call("emulated_backward", lse=lse_at, out=out_at, dout=dout_at, dq=grads_at[0],
              dk=grads_at[1], dv=grads_at[2])
    for name, at, n, w in zip(("dq", "dk", "dv"), grads_at, sizes, want):
        got = _read(emulator, at, n)
        assert np.all(np.isfinite(got)), name
        assert _nmse(got, w.ravel()) < GRADIENT_NMSE, name
