"""The shared tile core (src/cpu/tile/) as Highway's AVX-512 target compiles it, run on
an emulated Sapphire Rapids (tests/python/emulator.py, entries in
tests/emulated/tile_core_entries.cpp) and checked against float64: the exp, the widening of
float16 and bfloat16, the dot micro-kernel and its 16-lane shuffle tree, the context kernel
with 32 registers, and the online softmax. The C++ suites run the same code natively on
CPUs with AVX-512; this runs it everywhere."""

import struct

import numpy as np
import pytest

F32 = np.finfo(np.float32)


def _put_floats(emulator, values):
    return emulator.put(np.ascontiguousarray(values, np.float32).tobytes())


def _read_floats(emulator, address, count):
    return np.frombuffer(emulator.read(address, 4 * count), np.float32).copy()


def _pointers(emulator, base, count, stride_bytes):
    return emulator.put(struct.pack(f"<{count}Q", *(base + i * stride_bytes for i in range(count))))


def _ulps(got, want):
    """|got - want| in units of the last place of want rounded to float32."""
    spacing = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / np.maximum(spacing, F32.smallest_subnormal)


def test_vector_exp_within_two_ulp(emulator):
    """VectorExp (src/cpu/tile/vector_exp-inl.h): within 2 ulp of exp over [-87.33654, 88]; 0
    below (and for -inf), NaN for NaN, exp(88) above."""
    rng = np.random.default_rng(1)
    valid = np.concatenate([np.linspace(-87.33654, 88.0, 40000), rng.uniform(-20, 0, 8000),
                            [0.0, -0.0, 1.0, -1.0, 0.5 * np.log(2), -87.33654, 88.0]])
    edges = np.array([-np.inf, np.nan, -87.4, -100.0, -1e30, 88.5, 1e30, np.inf])
    x = np.concatenate([valid, edges]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % 16, np.float32)])
    emulator.reset_data()
    x_at, out_at = _put_floats(emulator, x), _put_floats(emulator, np.zeros_like(x))
    emulator.call("emulated_vector_exp", emulator.put(struct.pack("<QQq", x_at, out_at, len(x))))
    got = _read_floats(emulator, out_at, len(x))
    n = len(valid)
    assert np.all(np.isfinite(got[:n]))
    assert _ulps(got[:n], np.exp(x[:n].astype(np.float64))).max() <= 2.0
    edge = got[n:n + len(edges)]
    assert edge[0] == 0.0 and np.isnan(edge[1]) and np.all(edge[2:5] == 0.0)
    assert _ulps(edge[5:], np.full(3, np.exp(88.0))).max() <= 2.0


@pytest.mark.parametrize("bfloat", [False, True], ids=["float16", "bfloat16"])
def test_widening_every_pattern(emulator, bfloat):
    """load_floats of float16 and bfloat16: all 65536 patterns exactly, NaN staying NaN with
    its sign."""
    bits = np.arange(65536, dtype=np.uint16)
    if bfloat:
        want = (bits.astype(np.uint32) << 16).view(np.float32)
    else:
        want = bits.view(np.float16).astype(np.float32)
    emulator.reset_data()
    in_at = emulator.put(bits.tobytes())
    out_at = _put_floats(emulator, np.zeros(65536))
    emulator.call("emulated_widen",
                  emulator.put(struct.pack("<QQqi", in_at, out_at, 65536, int(bfloat))))
    got = _read_floats(emulator, out_at, 65536)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))


def _float16_rows(rng, count, dim):
    rows = rng.standard_normal((count, dim)).astype(np.float16)
    return rows, rows.astype(np.float64)


@pytest.mark.parametrize("dim", [16, 40, 64, 128, 136])
def test_scores_by_dot_matches_float64(emulator, dim):
    """scores_by_dot<float16, 4>: four rows against a block of keys (four on 32 registers),
    the 16-lane shuffle tree, then the d % 16 tail in order."""
    emulator.reset_data()
    keys = emulator.call("emulated_dot_keys", 0) & 0xFFFFFFFF
    rng = np.random.default_rng(dim)
    q = rng.standard_normal((4, dim)).astype(np.float32)
    k16, k = _float16_rows(rng, keys, dim)
    q_at, k_at = _put_floats(emulator, q), emulator.put(k16.tobytes())
    scores_at = _put_floats(emulator, np.full(4 * keys, np.nan))
    args = struct.pack("<QQqQ", _pointers(emulator, q_at, 4, 4 * dim),
                       _pointers(emulator, k_at, keys, 2 * dim), dim,
                       _pointers(emulator, scores_at, 4, 4 * keys))
    emulator.call("emulated_scores_by_dot", emulator.put(args))
    got = _read_floats(emulator, scores_at, 4 * keys).reshape(4, keys).astype(np.float64)
    want = q.astype(np.float64) @ k.T
    assert keys == 4 and np.all(np.isfinite(got))
    bound = dim * F32.eps * (np.abs(q.astype(np.float64)) @ np.abs(k).T)
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("rows, dim_v, first, end", [(1, 16, 0, 16), (2, 72, 3, 11),
                                                     (4, 128, 0, 16), (4, 256, 5, 16),
                                                     (4, 136, 2, 9)])
def test_context_by_rows_matches_float64(emulator, rows, dim_v, first, end):
    """context_by_rows<float16, rows>: acc[r] += sum_{t in [first, end)} p[r][t] values[t],
    in column chunks held in registers (8 or 4 vectors on AVX-512), then the tail."""
    rng = np.random.default_rng(rows * 100 + dim_v)
    count = 16
    acc = rng.standard_normal((rows, dim_v)).astype(np.float32)
    p = rng.uniform(0, 1, (rows, count)).astype(np.float32)
    v16, v = _float16_rows(rng, count, dim_v)
    emulator.reset_data()
    acc_at, p_at = _put_floats(emulator, acc), _put_floats(emulator, p)
    v_at = emulator.put(v16.tobytes())
    args = struct.pack("<QQQqqqi", _pointers(emulator, acc_at, rows, 4 * dim_v),
                       _pointers(emulator, p_at, rows, 4 * count),
                       _pointers(emulator, v_at, count, 2 * dim_v), first, end, dim_v, rows)
    emulator.call("emulated_context_by_rows", emulator.put(args))
    got = _read_floats(emulator, acc_at, rows * dim_v).reshape(rows, dim_v).astype(np.float64)
    p64 = p.astype(np.float64)[:, first:end]
    want = acc.astype(np.float64) + p64 @ v[first:end]
    assert np.all(np.isfinite(got))
    bound = (end - first + 1) * F32.eps * (np.abs(acc) + p64 @ np.abs(v[first:end]))
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("vectors, m, l", [(1, -np.inf, 0.0), (2, 0.5, 3.0), (3, 9.0, 2.0)])
def test_online_softmax_matches_float64(emulator, vectors, m, l):
    """online_softmax_keys: from a row's (m, l) and a tile's scores (hidden lanes -inf), the
    weights exp(s - m_new), the new (m, l), and the factor e^(m - m_new) for its acc."""
    rng = np.random.default_rng(vectors)
    s = (3 * rng.standard_normal(16 * vectors)).astype(np.float32)
    s[::5] = -np.inf
    emulator.reset_data()
    s_at = _put_floats(emulator, s)
    state_at = _put_floats(emulator, [m, l, np.nan])
    emulator.call("emulated_online_softmax",
                  emulator.put(struct.pack("<QqQ", s_at, vectors, state_at)))
    weights = _read_floats(emulator, s_at, 16 * vectors).astype(np.float64)
    new_m, new_l, rescale = _read_floats(emulator, state_at, 3).astype(np.float64)
    s64 = s.astype(np.float64)
    want_m = max(m, s64.max())
    # exp of the float32 differences, as the kernel subtracts: within VectorExp's 2 ulp.
    want_weights = np.exp((s - np.float32(want_m)).astype(np.float64))
    want_rescale = np.exp(np.float64(np.float32(m) - np.float32(want_m)))
    assert new_m == np.float32(want_m)
    assert np.all(weights[s == -np.inf] == 0.0)
    assert _ulps(weights, want_weights).max() <= 2.0
    assert _ulps(np.array([rescale]), np.array([want_rescale])).max() <= 2.0
    want_l = l * want_rescale + want_weights.sum()
    assert abs(new_l - want_l) <= 4 * len(s) * F32.eps * want_l


def test_online_softmax_keeps_nan(emulator):
    """A NaN score makes the row's max NaN (MaxOfScores keeps it where x86's max drops it)."""
    s = np.linspace(-1, 1, 32).astype(np.float32)
    s[17] = np.nan
    emulator.reset_data()
    s_at, state_at = _put_floats(emulator, s), _put_floats(emulator, [0.0, 1.0, 0.0])
    emulator.call("emulated_online_softmax", emulator.put(struct.pack("<QqQ", s_at, 2, state_at)))
    new_m, new_l, _ = _read_floats(emulator, state_at, 3)
    assert np.isnan(new_m) and np.isnan(new_l)


def test_scores_rows_vectorised_matches_float64(emulator):
    """scores_rows_vectorised<0, 3, 4> (float32 tiles): S^T[k][r] = sum_d K[k][d] Qt[d][r]
    for 4 keys and 48 rows; the padding rows of each key's scores stay untouched."""
    rng = np.random.default_rng(3)
    dim, rows, stride, keys = 72, 48, 64, 4
    qt = np.zeros((dim, stride), np.float32)
    qt[:, :rows] = rng.standard_normal((dim, rows))
    k = rng.standard_normal((keys, dim)).astype(np.float32)
    emulator.reset_data()
    qt_at, k_at = _put_floats(emulator, qt), _put_floats(emulator, k)
    out_at = _put_floats(emulator, np.full(keys * stride, -7.0))
    emulator.call("emulated_scores_rows_vectorised",
                  emulator.put(struct.pack("<QqQqQ", qt_at, stride,
                                           _pointers(emulator, k_at, keys, 4 * dim), dim, out_at)))
    out = _read_floats(emulator, out_at, keys * stride).reshape(keys, stride)
    got, want = out[:, :rows].astype(np.float64), k.astype(np.float64) @ qt[:, :rows]
    assert np.all(out[:, rows:] == -7.0)
    bound = dim * F32.eps * (np.abs(k.astype(np.float64)) @ np.abs(qt[:, :rows]))
    assert np.all(np.abs(got - want) <= bound)


def test_context_rows_vectorised_matches_float64(emulator):
    """context_rows_vectorised<3, 4>: O[r] = O[r] rescale[r] + sum_j P^T[j][r] V[j] for 4
    rows and 48 columns."""
    rng = np.random.default_rng(4)
    keys, p_stride, width, v_stride, o_stride = 21, 16, 48, 56, 64
    pt = rng.uniform(0, 1, (keys, p_stride)).astype(np.float32)
    v = rng.standard_normal((keys, v_stride)).astype(np.float32)
    o = rng.standard_normal((4, o_stride)).astype(np.float32)
    rescale = np.array([1.0, 0.5, 0.25, 2.0 ** -20], np.float32)
    emulator.reset_data()
    pt_at, v_at, o_at = (_put_floats(emulator, x) for x in (pt, v, o))
    args = struct.pack("<QqqQqqQQq", pt_at, p_stride, 1, v_at, v_stride, keys,
                       _put_floats(emulator, rescale), o_at, o_stride)
    emulator.call("emulated_context_rows_vectorised", emulator.put(args))
    out = _read_floats(emulator, o_at, 4 * o_stride).reshape(4, o_stride)
    p64, v64 = pt[:, :4].astype(np.float64).T, v[:, :width].astype(np.float64)
    want = o[:, :width] * rescale[:, None].astype(np.float64) + p64 @ v64
    assert np.all(out[:, width:] == o[:, width:])
    bound = (keys + 2) * F32.eps * (np.abs(o[:, :width]) * rescale[:, None] + p64 @ np.abs(v64))
    assert np.all(np.abs(out[:, :width] - want) <= bound)


def test_scores_keys_vectorised_matches_float64(emulator):
    """scores_keys_vectorised<4, 2> (backward's layout): S[r][key] = sum_d Q[r][d] K^T[d][key]
    for 4 rows and 32 keys."""
    rng = np.random.default_rng(5)
    dim, q_stride, kt_stride, out_stride = 40, 48, 40, 48  # S rows aligned: hn::Store
    q = rng.standard_normal((4, q_stride)).astype(np.float32)
    kt = rng.standard_normal((dim, kt_stride)).astype(np.float32)
    emulator.reset_data()
    q_at, kt_at = _put_floats(emulator, q), _put_floats(emulator, kt)
    out_at = _put_floats(emulator, np.full(4 * out_stride, -7.0))
    emulator.call("emulated_scores_keys_vectorised",
                  emulator.put(struct.pack("<QqQqqQq", q_at, q_stride, kt_at, kt_stride, dim,
                                           out_at, out_stride)))
    out = _read_floats(emulator, out_at, 4 * out_stride).reshape(4, out_stride)
    q64, k64 = q[:, :dim].astype(np.float64), kt[:, :32].astype(np.float64)
    assert np.all(out[:, 32:] == -7.0)
    bound = dim * F32.eps * (np.abs(q64) @ np.abs(k64))
    assert np.all(np.abs(out[:, :32] - q64 @ k64) <= bound)


def test_shape_scores_softcap_alibi_bias_and_hiding(emulator):
    """shape_scores<true>: cap tanh(x / cap), then - slope |position - key|, then the position
    bias gathered at the clamped offset key - position, then -inf outside [first, end), over
    one vector of keys."""
    rng = np.random.default_rng(6)
    x = (20 * rng.standard_normal(16)).astype(np.float32)
    key = np.arange(100, 116, dtype=np.int32)
    position, first, end, slope, cap = 109, 102, 113, 0.125, 30.0
    # Offsets -5 .. 6 laid out; the keys reach offsets -9 .. 6, so the low ones clamp.
    bias = rng.standard_normal(12).astype(np.float32)
    bias_first = -5
    emulator.reset_data()
    x_at, key_at = _put_floats(emulator, x), emulator.put(key.tobytes())
    bias_at = _put_floats(emulator, bias)
    emulator.call("emulated_shape_scores",
                  emulator.put(struct.pack("<QQiiifdQiii", x_at, key_at, position, first, end,
                                           slope, cap, bias_at, bias_first, bias.size,
                                           -bias_first)))
    got = _read_floats(emulator, x_at, 16).astype(np.float64)
    capped = np.float32(cap) * np.tanh(x.astype(np.float64) * np.float32(1 / cap))
    offset = np.clip(key - position, bias_first, bias_first + bias.size - 1)
    want = capped - slope * np.abs(position - key) + bias[offset - bias_first]
    shown = (key >= first) & (key < end)
    assert np.all(got[~shown] == -np.inf)
    assert np.all(np.abs(got[shown] - want[shown]) <= 8 * F32.eps * (cap + np.abs(want[shown])))


def test_online_softmax_rows_matches_float64(emulator):
    """online_softmax_rows: 16 rows (lanes) over 9 keys of P^T, hidden keys -inf, rows with
    and without an earlier state, one row that sees no key."""
    rng = np.random.default_rng(8)
    keys, stride = 9, 32  # rows aligned: hn::Load
    p = np.full((keys, stride), 5.0, np.float32)
    p[:, :16] = 3 * rng.standard_normal((keys, 16))
    p[:, :16][rng.uniform(size=(keys, 16)) < 0.3] = -np.inf
    p[:, 0] = -np.inf  # row 0 sees no key yet
    m = np.where(np.arange(16) % 2 == 0, -np.inf, rng.standard_normal(16)).astype(np.float32)
    m[0] = -np.inf
    l = np.where(m == -np.inf, 0.0, rng.uniform(1, 4, 16)).astype(np.float32)
    emulator.reset_data()
    p_at, m_at, l_at = _put_floats(emulator, p), _put_floats(emulator, m), _put_floats(emulator, l)
    rescale_at = _put_floats(emulator, np.zeros(16))
    emulator.call("emulated_online_softmax_rows",
                  emulator.put(struct.pack("<QqqQQQ", p_at, keys, stride, m_at, l_at, rescale_at)))
    weights = _read_floats(emulator, p_at, keys * stride).reshape(keys, stride)
    new_m, new_l = _read_floats(emulator, m_at, 16), _read_floats(emulator, l_at, 16)
    rescale = _read_floats(emulator, rescale_at, 16)
    want_m = np.maximum(m, p[:, :16].max(axis=0))
    shift = np.where(want_m == -np.inf, np.float32(0), want_m).astype(np.float32)
    want_w = np.exp((p[:, :16] - shift).astype(np.float64))
    want_rescale = np.exp((m - shift).astype(np.float64))
    assert np.all(weights[:, 16:] == 5.0)
    assert np.array_equal(new_m, want_m)
    assert _ulps(weights[:, :16], want_w).max() <= 2.0
    assert _ulps(rescale, want_rescale).max() <= 2.0
    want_l = l * want_rescale + want_w.sum(axis=0)
    assert np.all(np.abs(new_l - want_l) <= 4 * keys * F32.eps * want_l)
    assert new_l[0] == 0.0 and np.all(weights[:, 0] == 0.0)
