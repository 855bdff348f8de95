"""Kernels for CPU features this machine may lack, run on an emulated Sapphire Rapids
(tests/python/emulator.py) and checked against float64 references over a case list: NaN
and infinities first, then the bytes around each output (guards), then NMSE and max abs
error. These run the kernels' own code; where the CPU has the feature, the C++ suites run
the same paths natively as well."""

import struct

import numpy as np
import pytest
from emulator import Emulator

GUARD = np.float32(-1.5e38)  # a value no kernel writes


@pytest.fixture(scope="module")
def emulator():
    return Emulator()


def _bf16(x):
    """bfloat16 bits of x (round to nearest even) and their value in float64."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded, (rounded.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# (dim, keys, row vectors of 16, padding rows): odd key counts leave a partial block of
# four keys; the padding rows beyond the vectors must stay untouched.
SCORE_CASES = [(2, 1, 1, 0), (40, 9, 3, 16), (64, 4, 1, 0), (64, 7, 2, 5), (128, 5, 2, 16),
               (128, 8, 3, 0), (256, 3, 1, 3)]


@pytest.mark.parametrize("dim, keys, vectors, padding", SCORE_CASES)
def test_scores_rows_bf16_on_avx512_bf16(emulator, dim, keys, vectors, padding):
    """attn::cpu::scores_rows_bf16 (src/cpu/bf16_dot.cpp), the AVX512-BF16 scores of forward:
    out[k][row] = scale * sum_d k[d] q[row][d] on bf16 inputs, products exact in float32."""
    rng = np.random.default_rng(dim * 1000 + keys * 10 + vectors)
    rows, stride, scale = 16 * vectors, 16 * vectors + padding, 0.125
    q_bits, q = _bf16(rng.standard_normal((rows, dim)))
    k_bits, k = _bf16(rng.standard_normal((keys, dim)))
    want = scale * (k @ q.T)
    # [dim / 2][stride][2]: the pairs along d of each row, as the dot instruction takes them.
    pairs = np.zeros((dim // 2, stride, 2), np.uint16)
    pairs[:, :rows, :] = q_bits.T.reshape(dim // 2, 2, rows).transpose(0, 2, 1)
    emulator.reset_data()
    q_at = emulator.put(pairs.tobytes())
    k_at = emulator.put(k_bits.tobytes())
    pointers_at = emulator.put(struct.pack(f"<{keys}Q", *(k_at + 2 * dim * i for i in range(keys))))
    guarded = np.full(keys * stride + 64, GUARD, np.float32)  # 64 guard floats after the rows
    out_at = emulator.put(guarded.tobytes())
    args_at = emulator.put(struct.pack("<QqQqqfiQ", q_at, stride, pointers_at, keys, dim, scale,
                                       vectors, out_at))
    emulator.call("emulated_scores_rows_bf16", args_at)
    out = np.frombuffer(emulator.read(out_at, guarded.nbytes), np.float32)
    grid = out[:keys * stride].reshape(keys, stride)
    got = grid[:, :rows].astype(np.float64)
    assert np.all(np.isfinite(got))
    assert np.all(grid[:, rows:] == GUARD) and np.all(out[keys * stride:] == GUARD)
    # float32 sums of dim exact products: at most dim ulps of the sum of |products|.
    bound = dim * np.finfo(np.float32).eps * scale * (np.abs(k) @ np.abs(q).T)
    assert np.all(np.abs(got - want) <= bound)
    nmse = np.sum((got - want) ** 2) / np.sum(want ** 2)
    assert nmse < 1e-12


def test_scores_rows_bf16_keeps_nan_to_its_row(emulator):
    """A NaN in one query row makes that row's scores NaN and no other's."""
    dim, keys, rows = 64, 5, 16
    rng = np.random.default_rng(7)
    q = rng.standard_normal((rows, dim))
    q[3, 10] = np.nan
    q_bits, _ = _bf16(q)
    k_bits, _ = _bf16(rng.standard_normal((keys, dim)))
    pairs = q_bits.T.reshape(dim // 2, 2, rows).transpose(0, 2, 1).copy()
    emulator.reset_data()
    q_at = emulator.put(pairs.tobytes())
    k_at = emulator.put(k_bits.tobytes())
    pointers_at = emulator.put(struct.pack(f"<{keys}Q", *(k_at + 2 * dim * i for i in range(keys))))
    out_at = emulator.put(bytes(4 * keys * rows))
    emulator.call("emulated_scores_rows_bf16",
                  emulator.put(struct.pack("<QqQqqfiQ", q_at, rows, pointers_at, keys, dim, 1.0, 1,
                                           out_at)))
    out = np.frombuffer(emulator.read(out_at, 4 * keys * rows), np.float32).reshape(keys, rows)
    assert np.all(np.isnan(out[:, 3]))
    assert np.all(np.isfinite(np.delete(out, 3, axis=1)))
