"""The forward kernel as Highway's AVX-512 target compiles it (src/cpu/forward.cpp, built by
tests/emulated with a one-thread runtime), run on an emulated Sapphire Rapids
(tests/python/emulator.py) over a case list, against the float64 NumPy oracle with the C++
suite's bounds: NaN and infinities, then guard floats around each output, then NMSE and max
abs error. bf16 q and k take the AVX512-BF16 scores there (the CPU reports AVX512-BF16). The
same cases run natively through attn wherever the CPU has AVX-512; this runs them
everywhere."""

import struct

import ml_dtypes
import numpy as np
import pytest

import numpy_reference

CONTEXT_NMSE, LSE_MAX_ABS, WEIGHTS_MAX_ABS = 2e-12, 2e-5, 1e-6  # tests/cpu_forward_test.cpp
GUARD = np.float32(-1.5e38)
DTYPES = {"float32": 2, "bfloat16": 1}  # attn::DType


def _stored(x, dtype):
    """The bytes attn reads for x in dtype, and their values in float64."""
    x = np.ascontiguousarray(x, np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    return x.tobytes(), x.astype(np.float64)


def _guarded(emulator, count):
    """An output of count floats between two runs of 16 guard floats; its address."""
    at = emulator.put(np.full(count + 32, GUARD, np.float32).tobytes())
    return at + 64


def _read(emulator, at, count):
    raw = np.frombuffer(emulator.read(at - 64, 4 * (count + 32)), np.float32)
    assert np.all(raw[:16] == GUARD) and np.all(raw[16 + count:] == GUARD), "guards overwritten"
    return raw[16:16 + count].astype(np.float64)


# (batch, query heads, kv heads, len q, len k, head dim, causal, weights): the head-dim
# copies (64, 128 and the generic copy), grouped queries, tiles past one, a decoding row.
CASES = [(1, 2, 2, 33, 47, 64, False, False), (1, 4, 2, 70, 130, 128, True, False),
         (2, 2, 1, 17, 200, 40, False, True), (1, 4, 4, 1, 160, 64, False, False),
         (1, 2, 2, 96, 96, 80, True, True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, heads_q, heads_kv, len_q, len_k, dim, causal, weights", CASES)
def test_forward_matches_float64(emulator, dtype, batch, heads_q, heads_kv, len_q, len_k, dim,
                                 causal, weights):
    rng = np.random.default_rng(len_q * 1000 + len_k + dim)
    q_bytes, q = _stored(rng.standard_normal((batch, heads_q, len_q, dim)), dtype)
    k_bytes, k = _stored(rng.standard_normal((batch, heads_kv, len_k, dim)), dtype)
    v_bytes, v = _stored(rng.standard_normal((batch, heads_kv, len_k, dim)), dtype)
    scale = 1 / np.sqrt(dim)
    want, want_lse, want_weights = numpy_reference.attention(q, k, v, causal=causal, scale=scale)
    emulator.reset_data()
    q_at, k_at, v_at = (emulator.put(b) for b in (q_bytes, k_bytes, v_bytes))
    n_context, n_lse = batch * heads_q * len_q * dim, batch * heads_q * len_q
    n_weights = n_lse * len_k
    context_at, lse_at = _guarded(emulator, n_context), _guarded(emulator, n_lse)
    weights_at = _guarded(emulator, n_weights) if weights else 0
    args = struct.pack("<QQQiiqqqqqqqdQQQ", q_at, k_at, v_at, DTYPES[dtype], int(causal), batch,
                       heads_q, heads_kv, len_q, len_k, dim, dim, scale, context_at, lse_at,
                       weights_at)
    emulator.call("emulated_forward", emulator.put(args))
    context = _read(emulator, context_at, n_context)
    lse = _read(emulator, lse_at, n_lse)
    assert np.all(np.isfinite(context)) and np.all(np.isfinite(lse))
    nmse = np.sum((context - want.ravel()) ** 2) / np.sum(want ** 2)
    assert nmse < CONTEXT_NMSE
    assert np.abs(lse - want_lse.ravel()).max() < LSE_MAX_ABS
    if weights:
        got = _read(emulator, weights_at, n_weights)
        assert np.all(np.isfinite(got))
        assert np.abs(got - want_weights.ravel()).max() < WEIGHTS_MAX_ABS
