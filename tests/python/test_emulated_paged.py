"""The paged kernel (src/cpu/decode/decode.cpp) as Highway's AVX-512 target compiles it, built
by tests/emulated with a one-thread runtime and run on an emulated Sapphire Rapids
(tests/python/emulator.py): caller-owned pools in both layouts, every storage dtype (fp8
codes widened by way of float16 included), a
ragged batch, against float64 with tests/paged_test.cpp's bound; and the batch invariance
tests/paged_test.cpp checks bit for bit on the targets the CPU has, here on AVX-512: each
sequence alone, and a prefill in chunks, give the batch's (one shot's) state bits. d = 40
leaves a tail of 8 past the last whole AVX-512 vector. bf16 q over a bf16 cache takes the
vdpbf16ps products (AVX512-BF16, which the emulated CPU has), exact and rounded P."""

import struct

import ml_dtypes
import numpy as np
import pytest

import numpy_reference

CONTEXT_NMSE = 1e-12  # tests/paged_test.cpp
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "int8": 3, "fp8_e4m3": 4,
          "fp8_e5m2": 5, "int4": 6}  # attn::CacheDType
STORED = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "int8": np.int8, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
          "fp8_e5m2": ml_dtypes.float8_e5m2, "int4": np.uint8}
LAYOUTS = {"token_major": 0, "head_major": 1}
Q_DTYPES = {"float32": 2, "bfloat16": 1}  # attn::DType
PV_PRECISIONS = {"exact": 0, "bf16": 1}  # attn::PvPrecision
ROUNDED_P_NMSE = 1e-5  # tests/paged_test.cpp: each weight within 2^-8 of itself
HEADS_Q, HEADS_KV, DIM, DIM_V = 4, 2, 40, 24
# (keys, queries) per sequence: a decode token, a draft over a split (merged) context, more
# queries than keys, a sequence holding keys only, an empty one asked for queries, and a
# prefill run longer than one task's 32 queries (widened tiles).
SEQUENCES = [(37, 1), (600, 3), (5, 9), (300, 0), (0, 2), (130, 40)]


class _Batch:
    """Pools holding every sequence's tokens on shuffled pages (a table that is not monotone,
    spare pages between), and the float64 values they hold."""

    def __init__(self, dtype, layout, page, sequences=SEQUENCES, seed=7, q_dtype="float32",
                 dim_v=DIM_V, group=0, dim=DIM, head_scales=False, zero_point=False,
                 value_dtype=None):
        rng = np.random.default_rng(seed)
        self.dtype, self.layout, self.page, self.sequences = dtype, layout, page, sequences
        self.value_dtype = value_dtype or dtype  # values in another format than the keys
        self.q_dtype, self.dim_v, self.group, self.dim = q_dtype, dim_v, group, dim
        self.head_scales = head_scales  # fp8: a scale per KV head
        self.zero_point = zero_point  # int8, int4: an offset beside each scale
        self.max_pages = max(1, max(-(-length // page) for length, _ in sequences))
        self.pages = 2 * len(sequences) * self.max_pages
        order = rng.permutation(self.pages)
        self.table = np.zeros((len(sequences), self.max_pages), np.int32)
        shape = (self.pages, page, HEADS_KV) if layout == "token_major" else (
            self.pages, HEADS_KV, page)
        def pool(dtype, d):
            return np.zeros(shape + (d // (2 if dtype == "int4" else 1),), STORED[dtype])  # int4: pairs
        self.keys, self.values = pool(dtype, self.dim), pool(self.value_dtype, dim_v)
        # Per token, or per group of each row.
        groups = [(n // group,) if group else () for n in (self.dim, dim_v)]
        if zero_point:  # (scale, offset) pairs, [..., groups, 2]
            groups = [(n // group if group else 1, 2) for n in (self.dim, dim_v)]
        self.key_scales = (0.02 + 0.01 * rng.random(shape + groups[0])).astype(np.float32)
        self.value_scales = (0.02 + 0.01 * rng.random(shape + groups[1])).astype(np.float32)
        if zero_point:
            for scales in (self.key_scales, self.value_scales):
                scales[..., 1] = rng.uniform(-1, 1, scales.shape[:-1])
        head = [(0.05 + 4 * rng.random(HEADS_KV)).astype(np.float32) for _ in range(2)]
        if head_scales and dtype.startswith("fp8"):
            self.key_scales = head[0]
        if head_scales and self.value_dtype.startswith("fp8"):
            self.value_scales = head[1]
        self.k, self.v = [], []  # per sequence [Hkv, length, d] float64, as the pools hold them
        for s, (length, _) in enumerate(sequences):
            self.table[s] = order[2 * s * self.max_pages:(2 * s + 1) * self.max_pages]
            k = np.zeros((HEADS_KV, length, self.dim))
            v = np.zeros((HEADS_KV, length, dim_v))
            for t in range(length):
                page_index, slot = self.table[s][t // page], t % page
                for h in range(HEADS_KV):
                    at = (page_index, slot, h) if layout == "token_major" else (page_index, h, slot)
                    k[h, t] = self._store(self.keys, at, rng.standard_normal(self.dim),
                                          self._scale(False, at, h), dtype)
                    v[h, t] = self._store(self.values, at, rng.standard_normal(dim_v),
                                          self._scale(True, at, h), self.value_dtype)
            self.k.append(k)
            self.v.append(v)
        total_q = sum(n for _, n in sequences)
        self.q = rng.standard_normal((total_q, HEADS_Q, self.dim)).astype(STORED[q_dtype])

    def _head_scaled(self, dtype):
        return self.head_scales and dtype.startswith("fp8")

    def _scale(self, values, at, h):
        """The scales of the key or value row at `at` of KV head h (None: unscaled)."""
        dtype = self.value_dtype if values else self.dtype
        scales = self.value_scales if values else self.key_scales
        if self._head_scaled(dtype):
            return scales[h]
        return scales[at] if dtype in ("int8", "int4") else None

    def _store(self, pool, at, x, scale, dtype):
        offset = 0.0
        if self.zero_point and dtype in ("int8", "int4"):
            scale, offset = (np.repeat(part, len(x) // len(part)) for part in scale.T)
            x = x - offset
        if dtype in ("int8", "int4"):
            scale = np.repeat(scale, self.group) if self.group and not self.zero_point else scale
            if dtype == "int4":
                codes = np.clip(np.round(x / scale), -8, 7).astype(np.int64)
                # core/int4.hpp: in each block of 32, element j < 16 the low nibble of byte
                # j, element j + 16 its high nibble.
                blocks = (codes & 0xF).reshape(-1, 32)
                pool[at] = (blocks[:, :16] | (blocks[:, 16:] << 4)).reshape(-1)
                return codes * scale + offset
            pool[at] = np.clip(np.round(x / scale), -127, 127).astype(np.int8)
            return pool[at].astype(np.float64) * scale + offset
        if self._head_scaled(dtype):
            pool[at] = (x / scale).astype(STORED[dtype])
            return pool[at].astype(np.float64) * scale
        pool[at] = x.astype(STORED[dtype])
        return pool[at].astype(np.float64)

    def run(self, emulator, q, sequences, table, window_left=-1, softcap=0.0,
            pv_precision="bf16"):
        """The kernel's causal state rows for queries q [total_q, Hq, d] of `sequences`
        (keys, queries) with `table`: m, l [Hq, total_q] and acc [Hq, total_q, Dv],
        float32."""
        total_q = q.shape[0]
        emulator.reset_data()
        put = emulator.put
        starts = np.concatenate([[0], np.cumsum([n for _, n in sequences])]).astype(np.int32)
        lengths = np.array([length for length, _ in sequences], np.int32)
        rows = HEADS_Q * total_q
        m_at, l_at, acc_at = (put(bytes(4 * n) + bytes(64))
                              for n in (rows, rows, rows * self.dim_v))
        def scaled(dtype):
            return dtype in ("int8", "int4") or self._head_scaled(dtype)
        args = struct.pack(
            "<QQQQQiiiiQQQqqqqqqqqddQQQiiqii",
            put(np.ascontiguousarray(q, STORED[self.q_dtype]).tobytes()),
            put(self.keys.tobytes()), put(self.values.tobytes()),
            put(self.key_scales.tobytes()) if scaled(self.dtype) else 0,
            put(self.value_scales.tobytes()) if scaled(self.value_dtype) else 0, DTYPES[self.dtype],
            LAYOUTS[self.layout], 1, len(sequences), put(starts.tobytes()),
            put(lengths.tobytes()), put(np.ascontiguousarray(table, np.int32).tobytes()),
            self.max_pages, self.pages, self.page, HEADS_Q, HEADS_KV, self.dim, self.dim_v,
            window_left, 1 / np.sqrt(self.dim), softcap, m_at, l_at, acc_at,
            Q_DTYPES[self.q_dtype], PV_PRECISIONS[pv_precision], self.group, self.zero_point,
            DTYPES[self.value_dtype])
        emulator.call("emulated_paged", put(args))

        def read(at, count):
            return np.frombuffer(emulator.read(at, 4 * count), np.float32).copy()

        return (read(m_at, rows).reshape(HEADS_Q, total_q), read(l_at, rows).reshape(
            HEADS_Q, total_q), read(acc_at, rows * self.dim_v).reshape(HEADS_Q, total_q,
                                                                        self.dim_v))


def _expect_matches_float64(batch, state, context_nmse=CONTEXT_NMSE):
    m, l, acc = state
    assert np.all(np.isfinite(acc)) and np.all(np.isfinite(l))
    first = 0
    for s, (length, n_q) in enumerate(batch.sequences):
        rows = slice(first, first + n_q)
        first += n_q
        if n_q == 0:
            continue
        q = np.transpose(batch.q[rows], (1, 0, 2))[None].astype(np.float64)
        want, want_lse, _ = numpy_reference.attention(
            q, batch.k[s][None], batch.v[s][None], causal=True, bottom_right=True,
            scale=1 / np.sqrt(batch.dim))
        want, want_lse = want[0], want_lse[0]
        sees = np.isfinite(want_lse)
        # A row that sees no key: no weight, no value read.
        assert np.all(l[:, rows][~sees] == 0) and np.all(acc[:, rows][~sees] == 0)
        if not sees.any():
            continue
        got = acc[:, rows][sees] / l[:, rows][sees][:, None]
        err = np.sum((got - want[sees]) ** 2) / np.sum(want[sees] ** 2)
        assert err < context_nmse, f"sequence {s}: NMSE {err:.3g}"
        lse = m[:, rows][sees] + np.log(l[:, rows][sees].astype(np.float64))
        assert np.abs(lse - want_lse[sees]).max() < 2e-5


# int4's rows are blocks of 32 codes, longer than DIM: test_scaled_codes_match_float64.
@pytest.mark.parametrize("dtype", [name for name in DTYPES if name != "int4"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("page", [16, 5])
def test_paged_matches_float64(emulator, dtype, layout, page):
    batch = _Batch(dtype, layout, page)
    _expect_matches_float64(batch, batch.run(emulator, batch.q, batch.sequences, batch.table))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("page", [16, 5])
def test_bf16_products_match_float64(emulator, layout, page):
    """A bf16 cache with bf16 q (d 40: 8 past the last 32 pairs) and dim_v 64: the scores and
    P V on vdpbf16ps (cpu/tile/bf16_pairs-inl.h), exact P within float32's bound and rounded
    P (the default) within bf16's, its bits not exact P's."""
    batch = _Batch("bfloat16", layout, page, q_dtype="bfloat16", dim_v=64)
    exact = batch.run(emulator, batch.q, batch.sequences, batch.table, pv_precision="exact")
    _expect_matches_float64(batch, exact)
    rounded = batch.run(emulator, batch.q, batch.sequences, batch.table)
    _expect_matches_float64(batch, rounded, ROUNDED_P_NMSE)
    assert rounded[2].tobytes() != exact[2].tobytes()


@pytest.mark.parametrize("dtype,value_dtype,group,zero_point,head_scales,dim,dim_v", [
    ("int8", "float16", 0, False, False, DIM, DIM_V), ("int4", "int8", 32, True, False, 64, 32),
    ("float16", "int4", 32, False, False, DIM, 32), ("bfloat16", "fp8_e4m3", 0, False, True, DIM, DIM_V),
    ("fp8_e5m2", "float32", 0, False, True, DIM, DIM_V), ("float32", "int8", 0, True, False, DIM, DIM_V)])
def test_keys_and_values_of_two_dtypes_match_float64(emulator, dtype, value_dtype, group,
                                                     zero_point, head_scales, dim, dim_v):
    """Values in another format than the keys (widened per tile by their own reads) on the
    AVX-512 target: a pair for every kind of value reader, a prefill run among them."""
    batch = _Batch(dtype, "token_major", 16, dim=dim, dim_v=dim_v, group=group,
                   zero_point=zero_point, head_scales=head_scales, value_dtype=value_dtype)
    _expect_matches_float64(batch, batch.run(emulator, batch.q, batch.sequences, batch.table),
                            10 * CONTEXT_NMSE)


def _rows(state, first, count):
    return [x[:, first:first + count] for x in state]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype,group,zero_point,dim", [
    ("int8", 32, False, 64), ("int4", 32, False, 64), ("int4", 0, False, 64),
    ("int8", 0, True, DIM), ("int4", 32, True, 64)])
def test_scaled_codes_match_float64(emulator, layout, dtype, group, zero_point, dim):
    """int8 and int4 with a scale per group of 32 elements of each row, and int4 with one
    per row, and both with zero points (int8's per row of d 40, a tail past the last vector)
    (tests/paged_test.cpp's bound for them): the rows read with their scales (and offsets) in
    registers by the AVX-512 target (tile::GroupedRow)."""
    batch = _Batch(dtype, layout, 16, group=group, dim=dim, dim_v=32, zero_point=zero_point)
    state = batch.run(emulator, batch.q, batch.sequences, batch.table)
    _expect_matches_float64(batch, state, context_nmse=1e-11)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_head_scales_match_float64(emulator, layout, dtype):
    """fp8 pools with a scale per KV head (vLLM's k_scale and v_scale): the scores times the
    key head's scale and the weights times the value head's, in the shared shaper."""
    batch = _Batch(dtype, layout, 16, head_scales=True)
    _expect_matches_float64(batch, batch.run(emulator, batch.q, batch.sequences, batch.table))


@pytest.mark.parametrize("dtype", ["float16", "int8", "fp8_e4m3"])
def test_each_sequence_alone_gives_the_batchs_bits(emulator, dtype):
    batch = _Batch(dtype, "token_major", 16)
    whole = batch.run(emulator, batch.q, batch.sequences, batch.table)
    first = 0
    for s, (length, n_q) in enumerate(batch.sequences):
        if n_q == 0:
            continue  # attn::paged_attention does not call the kernel for no rows
        alone = batch.run(emulator, batch.q[first:first + n_q], [(length, n_q)],
                          batch.table[s:s + 1])
        for got, want in zip(alone, _rows(whole, first, n_q)):
            assert got.tobytes() == want.tobytes(), f"sequence {s}"
        first += n_q


@pytest.mark.parametrize("chunk", [1, 7])
@pytest.mark.parametrize("q_dtype", Q_DTYPES)
def test_chunked_prefill_gives_one_shots_bits(emulator, chunk, q_dtype):
    """A 70-query prefill (a run of 32 queries is 64 rows a KV head: widened tiles for
    float32 q, vdpbf16ps products for bf16 q and dim_v 64) in chunks, each chunk's queries
    the newest of the keys so far, with a window (so a chunk's first visible key is not a
    tile's, nor even) and softcap."""
    prompt, window, softcap = 70, 23, 20.0
    batch = _Batch("bfloat16", "head_major", 16, sequences=[(prompt, prompt)], q_dtype=q_dtype,
                   dim_v=DIM_V if q_dtype == "float32" else 64)
    whole = batch.run(emulator, batch.q, batch.sequences, batch.table, window, softcap)
    for begin in range(0, prompt, chunk):
        n = min(chunk, prompt - begin)
        part = batch.run(emulator, batch.q[begin:begin + n], [(begin + n, n)], batch.table,
                         window, softcap)
        for got, want in zip(part, _rows(whole, begin, n)):
            assert got.tobytes() == want.tobytes(), f"chunk at {begin}"
