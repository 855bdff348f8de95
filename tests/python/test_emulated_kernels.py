"""Kernels for CPU features this machine may lack, run on an emulated Sapphire Rapids
(tests/python/emulator.py) and checked against float64 references over a case list: NaN
and infinities first, then the floats around each output (guards), then NMSE and max abs
error. These run the kernels' own code; where the CPU has the feature, the C++ suites run
the same paths natively as well."""

import struct

import ml_dtypes
import numpy as np
import pytest

GUARD = np.float32(-1.5e38)  # a value no kernel writes
BF16_NAN = np.uint16(0x7FC0)
KEY_GAP = 6


def _bf16(x):
    """bfloat16 bits of x (rounded to nearest even) and their value in float64."""
    rounded = np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)
    return rounded.view(np.uint16), rounded.astype(np.float64)


def _run_scores(emulator, q, k, vectors, padding, scale):
    """S^T of the bf16-rounded q ([rows][dim]) and k ([keys][dim]) by scores_rows_bf16
    (src/cpu/bf16_dot.cpp), forward's scores on AVX512-BF16. Returns the rows' scores
    [keys][rows] and whether every float outside them kept its guard value."""
    rows, dim = q.shape
    keys = k.shape[0]
    stride = 16 * vectors + padding
    q_bits, _ = _bf16(q)
    k_bits, _ = _bf16(k)
    # [dim / 2][stride][2]: the pairs along d of each row, as the dot instruction takes them.
    pairs = np.zeros((dim // 2, stride, 2), np.uint16)
    pairs[:, :rows, :] = q_bits.T.reshape(dim // 2, 2, rows).transpose(0, 2, 1)
    # Key rows KEY_GAP elements apart, NaN between them: a read past a row shows.
    key_rows = np.full((keys, dim + KEY_GAP), BF16_NAN, np.uint16)
    key_rows[:, :dim] = k_bits
    emulator.reset_data()
    q_at = emulator.put(pairs.tobytes())
    k_at = emulator.put(key_rows.tobytes())
    guarded = np.full(keys * stride + 64, GUARD, np.float32)  # 64 guard floats after the rows
    out_at = emulator.put(guarded.tobytes())
    args = struct.pack("<QqQqqqfiQ", q_at, stride, k_at, dim + KEY_GAP, keys, dim, scale, vectors,
                       out_at)
    emulator.call("emulated_scores_rows_bf16", emulator.put(args))
    out = np.frombuffer(emulator.read(out_at, guarded.nbytes), np.float32)
    grid = out[:keys * stride].reshape(keys, stride)
    guards_kept = bool(np.all(grid[:, rows:] == GUARD) and np.all(out[keys * stride:] == GUARD))
    return grid[:, :rows].astype(np.float64), guards_kept


# (dim, keys, groups of 16 rows, padding rows): odd key counts leave a partial block of four
# keys; 1 to 3 groups; padding rows that must stay untouched.
SCORE_CASES = [(2, 1, 1, 0), (40, 9, 3, 16), (64, 4, 1, 0), (64, 7, 2, 5), (128, 5, 2, 16),
               (128, 8, 3, 0), (256, 3, 1, 3)]


@pytest.mark.parametrize("dim, keys, vectors, padding", SCORE_CASES)
def test_bf16_scores_match_float64(emulator, dim, keys, vectors, padding):
    """out[k][row] = scale * sum_d k[d] q[row][d] on bf16 inputs: products exact in float32,
    float32 sums."""
    rng = np.random.default_rng(dim * 1000 + keys * 10 + vectors)
    q = rng.standard_normal((16 * vectors, dim))
    k = rng.standard_normal((keys, dim))
    scale = 0.125
    got, guards_kept = _run_scores(emulator, q, k, vectors, padding, scale)
    q64, k64 = _bf16(q)[1], _bf16(k)[1]
    want = scale * (k64 @ q64.T)
    assert np.all(np.isfinite(got))
    assert guards_kept
    # float32 sums of dim exact products: at most dim ulps of the sum of |products|.
    bound = dim * np.finfo(np.float32).eps * scale * (np.abs(k64) @ np.abs(q64).T)
    assert np.all(np.abs(got - want) <= bound)
    nmse = np.sum((got - want) ** 2) / np.sum(want ** 2)
    assert nmse < 1e-12


def test_bf16_scores_keep_nan_to_its_row(emulator):
    """A NaN in one query row makes that row's scores NaN and no other's."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((16, 64))
    q[3, 10] = np.nan
    got, guards_kept = _run_scores(emulator, q, rng.standard_normal((5, 64)), 1, 0, 1.0)
    assert guards_kept
    assert np.all(np.isnan(got[:, 3]))
    assert np.all(np.isfinite(np.delete(got, 3, axis=1)))


def _run_context(emulator, weights, values, out, padding):
    """out_t + V^T P^T by context_rows_bf16 (src/cpu/bf16_dot.cpp), forward's P V on
    AVX512-BF16 with P rounded to bf16: weights [span][rows] (rows 16 per vector), values
    [span][dims], out [dims][rows] the transposed context it adds onto. Returns the new
    [dims][rows] and whether every float outside it kept its guard value."""
    span, rows = weights.shape
    dims = values.shape[1]
    w_bits, _ = _bf16(weights)
    v_bits, _ = _bf16(values)
    # [span / 2][rows][2]: each row's weights of a pair of keys, as put_weight_parts lays them.
    pairs = w_bits.reshape(span // 2, 2, rows).transpose(0, 2, 1).copy()
    # V^T rows KEY_GAP elements longer than the span, NaN past it: a read past the span shows.
    values_t = np.full((dims, span + KEY_GAP), BF16_NAN, np.uint16)
    values_t[:, :span] = v_bits.T
    stride = rows + padding
    guarded = np.full(dims * stride + 64, GUARD, np.float32)  # 64 guard floats after the rows
    guarded[:dims * stride].reshape(dims, stride)[:, :rows] = out
    emulator.reset_data()
    v_at = emulator.put(values_t.tobytes())
    w_at = emulator.put(pairs.tobytes())
    out_at = emulator.put(guarded.tobytes())
    args = struct.pack("<QqqQqqi4xQq", v_at, span + KEY_GAP, dims, w_at, rows, span, rows // 16,
                       out_at, stride)
    emulator.call("emulated_context_rows_bf16", emulator.put(args))
    got = np.frombuffer(emulator.read(out_at, guarded.nbytes), np.float32)
    grid = got[:dims * stride].reshape(dims, stride)
    guards_kept = bool(np.all(grid[:, rows:] == GUARD) and np.all(got[dims * stride:] == GUARD))
    return grid[:, :rows].astype(np.float64), guards_kept


# (value dims, keys, groups of 16 rows, padding rows): one pair of keys to more than a tile,
# 1 to 3 groups (16 or 8 dims a block), padding rows that must stay untouched.
CONTEXT_CASES = [(16, 2, 1, 0), (32, 6, 2, 3), (48, 64, 3, 0), (64, 66, 1, 16), (128, 130, 3, 5),
                 (256, 40, 2, 0)]


@pytest.mark.parametrize("dims, keys, vectors, padding", CONTEXT_CASES)
def test_bf16_context_matches_float64(emulator, dims, keys, vectors, padding):
    """out_t[d][r] + sum_k P[k][r] V[k][d] with P and V rounded to bf16: products exact in
    float32, float32 sums in key order."""
    rng = np.random.default_rng(dims * 1000 + keys * 10 + vectors)
    weights = rng.uniform(0, 1, (keys, 16 * vectors))
    values = rng.standard_normal((keys, dims))
    out = rng.standard_normal((dims, 16 * vectors)).astype(np.float32)
    got, guards_kept = _run_context(emulator, weights, values, out, padding)
    w64, v64 = _bf16(weights)[1], _bf16(values)[1]
    want = out + v64.T @ w64
    assert np.all(np.isfinite(got))
    assert guards_kept
    # float32 sums of keys exact products onto out: at most keys + 1 ulps of the sum of
    # magnitudes.
    bound = (keys + 1) * np.finfo(np.float32).eps * (np.abs(out) + np.abs(v64).T @ w64)
    assert np.all(np.abs(got - want) <= bound)
    nmse = np.sum((got - want) ** 2) / np.sum(want ** 2)
    assert nmse < 1e-12
