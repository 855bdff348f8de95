"""attn.paged_attention and attn.append_pages over pools the test owns (NumPy arrays and
torch tensors, written and read in place): against the float64 NumPy oracle over a ragged
batch in both layouts and every storage dtype; chunked prefill bit for bit; bad input
refused naming the argument, with nothing written."""

import ml_dtypes
import numpy as np
import pytest

import attn
import numpy_reference

HQ, HKV, D, DV = 4, 2, 32, 24
DTYPES = ["float32", "float16", "bfloat16", "int8", "fp8_e4m3", "fp8_e5m2"]


def make_pools(pages, page_size, layout, dtype, value_dtype=None):
    if value_dtype not in (None, dtype):  # keys of dtype, values of value_dtype
        keys, values = (make_pools(pages, page_size, layout, d) for d in (dtype, value_dtype))
        return keys[0], values[1], keys[2], values[3]
    shape = (pages, page_size, HKV) if layout == "token_major" else (pages, HKV, page_size)
    if dtype == "int8":
        return (np.zeros(shape + (D,), np.int8), np.zeros(shape + (DV,), np.int8),
                np.zeros(shape, np.float32), np.zeros(shape, np.float32))
    np_dtype = {"float32": np.float32, "float16": np.float16}.get(dtype)
    if np_dtype is None:
        import ml_dtypes
        np_dtype = {"bfloat16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
                    "fp8_e5m2": ml_dtypes.float8_e5m2}[dtype]
    return np.zeros(shape + (D,), np_dtype), np.zeros(shape + (DV,), np_dtype), None, None


def scales_kw(key_scales, value_scales):
    return {name: x for name, x in (("key_scales", key_scales), ("value_scales", value_scales))
            if x is not None}


def gathered(pool, scales, table_row, length, page_size, layout):
    """A sequence's [H, length, d] float64 rows, read back through its table row."""
    rows = []
    for t in range(length):
        page, slot = table_row[t // page_size], t % page_size
        row = pool[page, slot] if layout == "token_major" else pool[page, :, slot]
        row = row.astype(np.float64)
        if scales is not None and scales.ndim == 1:  # fp8: a scale per KV head
            row = row * scales[:, None]
        elif scales is not None:
            scale = scales[page, slot] if layout == "token_major" else scales[page, :, slot]
            row = row * scale[:, None]
        rows.append(row)
    return np.stack(rows, axis=1) if rows else np.zeros((HKV, 0, pool.shape[-1]))


class Batch:
    """Sequences of (keys, new queries) appended into pools through shuffled tables."""

    def __init__(self, sequences, page_size, layout, dtype, seed=0, head_scales=None,
                 value_dtype=None):
        rng = np.random.default_rng(seed)
        self.page_size, self.layout, self.dtype = page_size, layout, dtype
        self.lengths = [length for length, _ in sequences]
        self.queries = [n_q for _, n_q in sequences]
        pages_of = [-(-length // page_size) for length in self.lengths]
        self.max_pages = max(pages_of) + 1
        pages = sum(pages_of) + 2
        order = rng.permutation(pages).astype(np.int32)
        self.table = np.full((len(sequences), self.max_pages), -1, np.int32)
        at = 0
        for s, n in enumerate(pages_of):
            self.table[s, :n] = order[at:at + n]
            at += n
        self.k_cache, self.v_cache, self.k_scales, self.v_scales = make_pools(
            pages, page_size, layout, dtype, value_dtype)
        if head_scales is not None:
            self.k_scales, self.v_scales = head_scales
        slots = []
        for s, length in enumerate(self.lengths):
            slots += [self.table[s, t // page_size] * page_size + t % page_size for t in range(length)]
        total = sum(self.lengths)
        attn.append_pages(rng.standard_normal((total, HKV, D)), rng.standard_normal((total, HKV, DV)),
                          np.array(slots, np.int64), self.k_cache, self.v_cache, layout=layout,
                          **scales_kw(self.k_scales, self.v_scales))
        self.q = rng.standard_normal((sum(self.queries), HQ, D)).astype(np.float32)
        self.query_start = np.concatenate([[0], np.cumsum(self.queries)]).astype(np.int32)
        self.seq_lens = np.array(self.lengths, np.int32)

    def run(self, **options):
        return attn.paged_attention(self.q, self.k_cache, self.v_cache, self.table, self.seq_lens,
                                    self.query_start, layout=self.layout, return_lse=True,
                                    **scales_kw(self.k_scales, self.v_scales), **options)

    def reference(self, s, **options):
        first, n_q = self.query_start[s], self.queries[s]
        k = gathered(self.k_cache, self.k_scales, self.table[s], self.lengths[s], self.page_size, self.layout)
        v = gathered(self.v_cache, self.v_scales, self.table[s], self.lengths[s], self.page_size, self.layout)
        q = self.q[first:first + n_q].astype(np.float64).transpose(1, 0, 2)
        out, lse, _ = numpy_reference.attention(q[None], k[None], v[None], bottom_right=True, **options)
        return out[0].transpose(1, 0, 2), lse[0].T


def nmse(got, want):
    return float(np.sum((got - want) ** 2) / max(np.sum(want ** 2), 1e-300))


@pytest.mark.parametrize("layout", ["token_major", "head_major"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_a_ragged_batch_matches_the_reference(layout, dtype, page_size):
    batch = Batch([(0, 2), (37, 1), (700, 3), (5, 9), (40, 0), (300, 40)], page_size, layout, dtype)
    for options in ({"causal": True}, {"causal": True, "window": (100, -1), "softcap": 10.0},
                    {"causal": False, "sinks": [0.5, -1.0, 1.0, 0.0]}):
        out, lse = batch.run(**options)
        assert out.shape == (sum(batch.queries), HQ, DV) and out.dtype == np.float32
        for s in range(len(batch.lengths)):
            first, n_q = batch.query_start[s], batch.queries[s]
            want_out, want_lse = batch.reference(s, **options)
            got_out, got_lse = out[first:first + n_q], lse[first:first + n_q]
            assert np.array_equal(np.isinf(got_lse), np.isinf(want_lse))
            finite = np.isfinite(want_lse)
            assert nmse(got_out, want_out) < 1e-12, (s, options)
            assert nmse(got_lse[finite], want_lse[finite]) < 1e-12, (s, options)


@pytest.mark.parametrize("dtype, value_dtype", [("float16", "int8"), ("int8", "bfloat16"),
                                                ("fp8_e4m3", "fp8_e5m2"), ("float32", "fp8_e4m3")])
def test_keys_and_values_of_two_dtypes_match_the_reference(dtype, value_dtype):
    """K and V in two formats (llama.cpp's type_k and type_v), each pool's dtype saying its
    own, written by append_pages and read by paged_attention."""
    batch = Batch([(37, 1), (700, 3), (300, 40)], 16, "token_major", dtype, seed=2,
                  value_dtype=value_dtype)
    out, lse = batch.run(causal=True)
    for s in range(len(batch.lengths)):
        first, n_q = batch.query_start[s], batch.queries[s]
        want_out, want_lse = batch.reference(s, causal=True)
        assert nmse(out[first:first + n_q], want_out) < 1e-11, s
        assert nmse(lse[first:first + n_q], want_lse) < 1e-12, s
    # kv_cache_dtype "int8" names what "auto" reads an int8 pool as.
    named = tuple("int8" if x == "int8" else "auto" for x in (dtype, value_dtype))
    got = batch.run(causal=True, kv_cache_dtype=named)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, (out, lse))), named


def test_chunked_prefill_gives_the_bits_of_one_shot():
    batch = Batch([(600, 600), (200, 1)], 16, "token_major", "float16", seed=1)
    whole = batch.run(causal=True)
    context, lses = [], []
    for begin in range(0, 600, 64):
        n = min(64, 600 - begin)
        q = np.concatenate([batch.q[begin:begin + n], batch.q[600:]])
        out, lse = attn.paged_attention(q, batch.k_cache, batch.v_cache, batch.table,
                                        [begin + n, 200], [0, n, n + 1], return_lse=True,
                                        causal=True)
        context.append(out[:n])
        lses.append(lse[:n])
    assert np.concatenate(context).tobytes() == whole[0][:600].tobytes()
    assert np.concatenate(lses).tobytes() == whole[1][:600].tobytes()


def test_torch_pools_are_read_and_written_in_place():
    torch = pytest.importorskip("torch")
    page_size, pages = 16, 6
    k_cache = torch.zeros(pages, page_size, HKV, D, dtype=torch.bfloat16)
    v_cache = torch.zeros(pages, page_size, HKV, DV, dtype=torch.bfloat16)
    k = torch.randn(40, HKV, D)
    v = torch.randn(40, HKV, DV)
    table = torch.tensor([[4, 1, 3]], dtype=torch.int32)
    slots = torch.tensor([int(table[0, t // page_size]) * page_size + t % page_size for t in range(40)])
    attn.append_pages(k, v, slots, k_cache, v_cache)
    assert torch.equal(k_cache[1, 3], k[19].to(torch.bfloat16))
    assert torch.equal(v_cache[3, 7], v[39].to(torch.bfloat16))
    q = torch.randn(2, HQ, D)
    out = attn.paged_attention(q, k_cache, v_cache, table, torch.tensor([40], dtype=torch.int32),
                               torch.tensor([0, 2], dtype=torch.int32), causal=True)
    assert isinstance(out, torch.Tensor) and out.shape == (2, HQ, DV)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(0, 1)[None], k.to(torch.bfloat16).double().transpose(0, 1)[None]
        .repeat_interleave(HQ // HKV, 1), v.to(torch.bfloat16).double().transpose(0, 1)[None]
        .repeat_interleave(HQ // HKV, 1),
        attn_mask=torch.ones(2, 40, dtype=torch.bool).tril(38))[0].transpose(0, 1)
    assert float(((out.double() - want) ** 2).sum() / (want ** 2).sum()) < 1e-12


def test_bad_input_is_refused_naming_the_argument_and_writes_nothing():
    batch = Batch([(20, 1), (40, 2)], 16, "token_major", "int8")
    before = [x.copy() for x in (batch.k_cache, batch.v_cache, batch.k_scales, batch.v_scales)]
    kv = dict(key_scales=batch.k_scales, value_scales=batch.v_scales)
    k, v = np.ones((2, HKV, D)), np.ones((2, HKV, DV))
    with pytest.raises(ValueError, match="^slots: expected each slot at most once"):
        attn.append_pages(k, v, [3, 3], batch.k_cache, batch.v_cache, **kv)
    with pytest.raises(ValueError, match="^slots: expected slots below"):
        attn.append_pages(k, v, [0, 10**6], batch.k_cache, batch.v_cache, **kv)
    with pytest.raises(ValueError, match="^key_cache: expected a C-contiguous array"):
        attn.append_pages(k, v, [0, 1], batch.k_cache[:, ::2], batch.v_cache, **kv)
    with pytest.raises(ValueError, match="^keys.scales: expected"):
        attn.append_pages(k, v, [0, 1], batch.k_cache, batch.v_cache)
    with pytest.raises(ValueError, match="^layout: expected 'token_major' or 'head_major'"):
        attn.append_pages(k, v, [0, 1], batch.k_cache, batch.v_cache, layout="nhd", **kv)
    with pytest.raises(TypeError, match="^key_cache: expected a NumPy array or a torch tensor"):
        attn.append_pages(k, v, [0, 1], batch.k_cache.tolist(), batch.v_cache, **kv)
    for got, want in zip((batch.k_cache, batch.v_cache, batch.k_scales, batch.v_scales), before):
        assert np.array_equal(got, want)
    run = lambda **changes: attn.paged_attention(  # noqa: E731
        changes.get("q", batch.q), batch.k_cache, batch.v_cache, changes.get("table", batch.table),
        changes.get("seq_lens", batch.seq_lens), changes.get("query_start", batch.query_start), **kv,
        **changes.get("options", {}))
    table = batch.table.copy()
    table[0, 1] = 99
    with pytest.raises(ValueError, match=r"^block_table: expected pages in \[0, "):
        run(table=table)
    with pytest.raises(ValueError, match="^seq_lens: expected lengths from 0 to max_pages"):
        run(seq_lens=[20, 1000])
    with pytest.raises(ValueError, match="^query_start: expected a last offset equal to q's 3 rows"):
        run(query_start=[0, 1, 2])
    with pytest.raises(ValueError, match="^seq_lens: expected values that fit int32"):
        run(seq_lens=[20, 2**40])
    with pytest.raises(TypeError, match="^block_table: expected integers"):
        run(table=batch.table.astype(np.float32))
    with pytest.raises(ValueError, match=r"^q: expected 3 dims \[total_q, Hq, D\]"):
        run(q=batch.q[None])
    with pytest.raises(TypeError, match="^causal_align: not an option of paged_attention"):
        run(options={"causal_align": "top-left"})


def rotated(x, positions, cos, sin, style, dims):
    """x [n, H, D] rotated per row at positions [n], in float64 (written from the definition)."""
    x = np.array(x, np.float64)
    half = dims // 2
    c, s = cos[positions][:, None, :].astype(np.float64), sin[positions][:, None, :].astype(np.float64)
    a = x[..., :half].copy() if style == "neox" else x[..., 0:dims:2].copy()
    b = x[..., half:dims].copy() if style == "neox" else x[..., 1:dims:2].copy()
    ra, rb = a * c - b * s, b * c + a * s
    if style == "neox":
        x[..., :half], x[..., half:dims] = ra, rb
    else:
        x[..., 0:dims:2], x[..., 1:dims:2] = ra, rb
    return x


@pytest.mark.parametrize("style", ["neox", "interleaved"])
@pytest.mark.parametrize("dims", [16, D])
def test_rotary_keys_and_queries_match_the_reference(style, dims):
    rng = np.random.default_rng(3)
    length, n_q, page_size = 50, 3, 16
    angles = np.arange(64)[:, None] * 10000.0 ** (-np.arange(dims // 2) * 2.0 / dims)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    k_cache, v_cache, _, _ = make_pools(5, page_size, "token_major", "float32")
    table = np.array([[3, 0, 4, 1]], np.int32)
    slots = np.array([table[0, t // page_size] * page_size + t % page_size for t in range(length)])
    k, v = rng.standard_normal((length, HKV, D)), rng.standard_normal((length, HKV, DV))
    rotary = dict(rotary=style, rotary_cos=cos, rotary_sin=sin, rotary_dims=dims)
    attn.append_pages(k, v, slots, k_cache, v_cache, positions=np.arange(length), **rotary)
    want_k = rotated(k, np.arange(length), cos, sin, style, dims).astype(np.float32)
    stored = np.stack([k_cache[table[0, t // page_size], t % page_size] for t in range(length)])
    assert np.array_equal(stored, want_k)
    q = rng.standard_normal((n_q, HQ, D)).astype(np.float32)
    out = attn.paged_attention(q, k_cache, v_cache, table, [length], [0, n_q], causal=True, **rotary)
    q_rot = rotated(q, np.arange(length - n_q, length), cos, sin, style, dims)
    want, _, _ = numpy_reference.attention(q_rot.transpose(1, 0, 2)[None],
                                           want_k.astype(np.float64).transpose(1, 0, 2)[None],
                                           v.astype(np.float32).astype(np.float64).transpose(1, 0, 2)[None],
                                           causal=True, bottom_right=True)
    assert nmse(out, want[0].transpose(1, 0, 2)) < 1e-12
    with pytest.raises(ValueError, match=r"^rotary.positions: expected 50 positions"):
        attn.append_pages(k, v, slots, k_cache, v_cache, **rotary)
    with pytest.raises(ValueError, match="^rotary: expected 'neox', 'interleaved' or None"):
        attn.paged_attention(q, k_cache, v_cache, table, [length], [0, n_q], rotary="gptj")


def append_tokens(cache, seq, n, rng):
    cache.append(seq, rng.standard_normal((HKV, n, D)), rng.standard_normal((HKV, n, DV)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_kvcache_pools_serve_a_ragged_batch_with_decodes_bits(dtype):
    """paged_attention over KVCache.pools() and block_tables(): each sequence's rows are
    attn.decode's bits for it alone, with a fork sharing its parent's pages."""
    rng = np.random.default_rng(3)
    cache = attn.KVCache(HKV, D, DV, page_size=16, dtype=dtype, max_blocks=32)
    key_cache, value_cache, key_scales, value_scales = cache.pools()  # before any append
    ids = [cache.add_sequence() for _ in range(3)]
    for seq, n in zip(ids, (70, 45, 9)):
        append_tokens(cache, seq, n, rng)
    ids.append(cache.fork(ids[1]))
    append_tokens(cache, ids[3], 6, rng)
    queries = [20, 1, 0, 3]
    query_start = np.concatenate([[0], np.cumsum(queries)]).astype(np.int32)
    q = rng.standard_normal((int(query_start[-1]), HQ, D)).astype(np.float32)
    table, seq_lens = cache.block_tables(ids)
    assert table.dtype == np.int32 and seq_lens.tolist() == [70, 45, 9, 51]
    assert table[3, :2].tolist() == table[1, :2].tolist()  # the fork's full pages are shared
    out = attn.paged_attention(q, key_cache, value_cache, table, seq_lens, query_start,
                               layout="head_major", key_scales=key_scales,
                               value_scales=value_scales, causal=True)
    for s, seq in enumerate(ids):
        if queries[s] == 0:
            continue
        rows = q[query_start[s]:query_start[s + 1]]  # [n_q, Hq, D] -> decode's [1, Hq, n_q, D]
        alone = attn.decode(rows.transpose(1, 0, 2)[None], cache, [seq], causal=True)
        assert np.array_equal(out[query_start[s]:query_start[s + 1]], alone[0].transpose(1, 0, 2))


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_pools_as_uint8_codes_or_torch_float8_read_the_same(dtype):
    """vLLM's fp8 caches are uint8 tensors with kv_cache_dtype naming the format; torch's and
    ml_dtypes' float8 pools say it by their dtype: the same codes give the same bits, and
    append_pages stores each element rounded to nearest, saturating."""
    torch = pytest.importorskip("torch")
    batch = Batch([(37, 1), (70, 3)], 16, "token_major", dtype, seed=4)
    want = batch.run(causal=True)
    codes = (batch.k_cache.view(np.uint8), batch.v_cache.view(np.uint8))
    float8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[dtype]
    # vLLM's "fp8" is e4m3.
    names = [dtype, "fp8"] if dtype == "fp8_e4m3" else [dtype]
    for k_cache, v_cache, kw in (
            *((*codes, {"kv_cache_dtype": name}) for name in names),
            (*(torch.from_numpy(c).view(float8) for c in codes), {}),
            (*(torch.from_numpy(c) for c in codes), {"kv_cache_dtype": dtype})):
        got = attn.paged_attention(batch.q, k_cache, v_cache, batch.table, batch.seq_lens,
                                   batch.query_start, return_lse=True, causal=True, **kw)
        assert all(np.asarray(g).tobytes() == w.tobytes() for g, w in zip(got, want))
    largest = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}[dtype]
    k_pool, v_pool = (torch.zeros(2, 4, HKV, d, dtype=float8) for d in (D, DV))
    k = torch.full((1, HKV, D), 0.3)
    k[0, 0, :3] = torch.tensor([1e9, -largest * 1.1, 2.0 ** -30])
    attn.append_pages(k, torch.zeros(1, HKV, DV), [5], k_pool, v_pool)
    torch_rounded = k.clamp(-largest, largest).to(float8).float()[0]
    assert k_pool[1, 1].float().tolist() == torch_rounded.tolist()
    assert k_pool[1, 1, 0, :3].float().tolist() == [largest, -largest, 0.0]
    with pytest.raises(ValueError, match=f"^v: expected finite values for {dtype} pages"):
        attn.append_pages(k, torch.full((1, HKV, DV), float("nan")), [6], k_pool, v_pool)
    assert not k_pool[1, 2].float().any()  # nothing written


@pytest.mark.parametrize("layout", ["token_major", "head_major"])
@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_head_scales_match_the_reference(layout, dtype):
    """fp8 pools with a scale per KV head (vLLM's k_scale and v_scale, per head): append_pages
    stores the code of x / scale, paged_attention reads code * scale, against the float64
    oracle; one number stands for every head, as vLLM passes it."""
    scales = (np.array([0.05, 3.0], np.float32), np.array([2.5, 0.125], np.float32))
    batch = Batch([(0, 1), (37, 1), (300, 4)], 16, layout, dtype, seed=5, head_scales=scales)
    unscaled = Batch([(0, 1), (37, 1), (300, 4)], 16, layout, dtype, seed=5)
    assert not np.array_equal(batch.k_cache.view(np.uint8), unscaled.k_cache.view(np.uint8))
    for options in ({"causal": True}, {"causal": False, "softcap": 10.0}):
        out, lse = batch.run(**options)
        for s in range(len(batch.lengths)):
            first, n_q = batch.query_start[s], batch.queries[s]
            want_out, want_lse = batch.reference(s, **options)
            assert nmse(out[first:first + n_q], want_out) < 1e-12, (s, options)
            finite = np.isfinite(want_lse)
            assert nmse(lse[first:first + n_q][finite], want_lse[finite]) < 1e-12, (s, options)
    torch = pytest.importorskip("torch")
    batch.k_scales = np.full(HKV, 0.75, np.float32)
    want = batch.run(causal=True)
    for k_scale in (0.75, np.float32(0.75), torch.tensor(0.75), torch.tensor([0.75])):
        got = attn.paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.table,
                                   batch.seq_lens, batch.query_start, layout=layout,
                                   key_scales=k_scale, value_scales=batch.v_scales,
                                   return_lse=True, causal=True)
        assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_kvcache_head_scales_are_stored_shown_and_read(dtype):
    """A KVCache of fp8 with k_scale and v_scale (a scale per KV head, or one number for
    every head): keys() reads code * scale for the code of x / scale, pools() shows the
    scales, and paged_attention over the pools gives decode's bits, within float32's bound of
    float64 over what the cache holds. Scales are for fp8, one per KV head, positive."""
    d, dv, n = 64, 32, 40
    rng = np.random.default_rng(4)
    k = (4 * rng.standard_normal((HKV, n, d))).astype(np.float32)
    v = rng.standard_normal((HKV, n, dv)).astype(np.float32)
    codes = ml_dtypes.float8_e4m3fn if dtype == "fp8_e4m3" else ml_dtypes.float8_e5m2
    for k_scale, v_scale in (([0.5, 3.0], [2.0, 0.25]), (0.75, np.float32(1.5))):
        cache = attn.KVCache(HKV, d, dv, dtype=dtype, k_scale=k_scale, v_scale=v_scale,
                             max_blocks=4)
        k_heads = np.broadcast_to(np.float32(k_scale), (HKV,))
        v_heads = np.broadcast_to(np.float32(v_scale), (HKV,))
        assert cache.k_scale == k_heads.tolist() and cache.v_scale == v_heads.tolist()
        seq = cache.add_sequence()
        cache.append(seq, k, v)
        stored = (k / k_heads[:, None, None]).astype(codes).astype(np.float32)
        assert np.array_equal(cache.keys(seq), stored * k_heads[:, None, None])
        kc, vc, ks, vs = cache.pools()
        assert ks.tolist() == k_heads.tolist() and vs.tolist() == v_heads.tolist()
        q = rng.standard_normal((1, HQ, d)).astype(np.float32)
        table, seq_lens = cache.block_tables([seq])
        out = attn.paged_attention(q, kc, vc, table, seq_lens, [0, 1], layout="head_major",
                                   key_scales=ks, value_scales=vs, kv_cache_dtype=dtype)
        alone = attn.decode(q.transpose(1, 0, 2)[None], cache, [seq])
        assert np.array_equal(out, alone[0].transpose(1, 0, 2))
        want, _, _ = numpy_reference.attention(
            q.astype(np.float64).transpose(1, 0, 2)[None], cache.keys(seq)[None].astype(
                np.float64), cache.values(seq)[None].astype(np.float64))
        assert nmse(out, want[0].transpose(1, 0, 2)) < 1e-12
    with pytest.raises(ValueError, match="^k_scale: expected one scale per KV head \\(2\\), "
                                         "given 3"):
        attn.KVCache(HKV, d, dtype=dtype, k_scale=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="^v_scale: expected a positive finite scale per KV "
                                         "head, given -1"):
        attn.KVCache(HKV, d, dtype=dtype, v_scale=-1.0)
    with pytest.raises(ValueError, match="^k_scale: expected none for int8 \\(a scale per KV "
                                         "head is for fp8\\)"):
        attn.KVCache(HKV, d, dtype="int8", k_scale=1.0)


def test_fp8_head_scales_are_checked_naming_the_argument():
    batch = Batch([(9, 1)], 16, "token_major", "fp8_e4m3")
    args = (batch.q, batch.k_cache, batch.v_cache, batch.table, batch.seq_lens, batch.query_start)
    with pytest.raises(ValueError, match="^key_scales: expected shape \\[2\\] \\(one scale per KV "
                                         "head of key_cache, for fp8\\), given \\[3\\]"):
        attn.paged_attention(*args, key_scales=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="^value_scales: expected positive finite scales, given "
                                         "\\[1.0, 0.0\\]"):
        attn.paged_attention(*args, value_scales=np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="^key_scales: expected positive finite scales"):
        attn.append_pages(np.zeros((1, HKV, D)), np.zeros((1, HKV, DV)), [0], batch.k_cache,
                          batch.v_cache, key_scales=float("nan"))
    with pytest.raises(TypeError, match="^key_scales: expected a number or float array"):
        attn.paged_attention(*args, key_scales="one")


def test_fp8_pool_dtypes_are_checked_naming_the_argument():
    torch = pytest.importorskip("torch")
    batch = Batch([(9, 1)], 16, "token_major", "fp8_e4m3")
    args = (batch.q, batch.k_cache, batch.v_cache, batch.table, batch.seq_lens, batch.query_start)
    with pytest.raises(ValueError, match="^kv_cache_dtype: expected one of 'auto', 'fp8'"):
        attn.paged_attention(*args, kv_cache_dtype="fp16")
    with pytest.raises(ValueError, match="^key_cache: expected a pool of 'int8', as "
                                         "kv_cache_dtype says, given float8_e4m3fn"):
        attn.paged_attention(*args, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="^value_cache: expected a pool of 'int8'"):
        attn.paged_attention(*args, kv_cache_dtype=("fp8", "int8"))
    with pytest.raises(ValueError, match="^kv_cache_dtype: expected one of 'auto'.* or a "
                                         "\\(keys, values\\) pair of them, given \\('auto',\\)"):
        attn.paged_attention(*args, kv_cache_dtype=("auto",))
    with pytest.raises(ValueError, match="^key_cache: expected a pool of 'fp8_e5m2', as "
                                         "kv_cache_dtype says, given float8_e4m3fn"):
        attn.paged_attention(*args, kv_cache_dtype="fp8_e5m2")
    e5m2_values = torch.from_numpy(batch.v_cache.view(np.uint8)).view(torch.float8_e5m2)
    with pytest.raises(ValueError, match="^value_cache: expected a pool of 'fp8_e4m3'"):
        attn.paged_attention(*args[:2], e5m2_values, *args[3:], kv_cache_dtype="fp8_e4m3")
    with pytest.raises(TypeError, match="^key_cache: expected dtype .*uint8 with kv_cache_dtype"):
        attn.paged_attention(args[0], batch.k_cache.view(np.uint8), batch.v_cache.view(np.uint8),
                             *args[3:])
    with pytest.raises(TypeError, match="^key_cache: expected dtype uint8 \\(codes\\)"):
        attn.paged_attention(args[0], np.zeros((2, 16, HKV, D), np.float16),
                             batch.v_cache.view(np.uint8), *args[3:], kv_cache_dtype="fp8_e4m3")


def int4_codes(pairs):
    """uint8 [..., n / 2] code pairs (core/int4.hpp: in each block of 32, element j < 16 the
    low nibble of byte j, element j + 16 its high nibble) -> int codes [..., n]."""
    blocks = pairs.reshape(*pairs.shape[:-1], -1, 16).astype(np.int16)
    nibbles = np.concatenate([blocks & 0xF, blocks >> 4], axis=-1)
    return np.where(nibbles >= 8, nibbles - 16, nibbles).reshape(*pairs.shape[:-1], -1)


@pytest.mark.parametrize("layout", ["token_major", "head_major"])
@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("zero_point", [False, True])
def test_grouped_pools_match_the_reference_and_the_kvcache(layout, dtype, zero_point):
    """int8 and int4 with a scale per group of 32 elements ([..., D / 32] scales), or with
    zero points a (scale, offset) pair per group ([..., D / 32, 2]): append_pages finds each
    group's scale (quantised once), paged_attention matches float64 over what the pools hold,
    and a KVCache with group=32 holds the same codes and scales and decodes to the same
    bits."""
    d, dv, group, page_size, lengths = 64, 32, 32, 16, [37, 70]
    rng = np.random.default_rng(6)
    shape = (12, page_size, HKV) if layout == "token_major" else (12, HKV, page_size)
    int4 = dtype == "int4"
    k_cache, v_cache = (np.zeros(shape + (n // 2,), np.uint8) if int4
                        else np.zeros(shape + (n,), np.int8) for n in (d, dv))
    kind = {"kv_cache_dtype": "int4"} if int4 else {}
    pair = (2,) if zero_point else ()
    k_scales = np.zeros(shape + (d // group,) + pair, np.float32)
    v_scales = np.zeros(shape + (dv // group,) + pair, np.float32)
    table = np.array([[3, 0, 7, 0, 0], [5, 1, 2, 9, 11]], np.int32)
    k = [rng.standard_normal((n, HKV, d)) * np.where(np.arange(d) == 40, 30.0, 1.0)
         for n in lengths]
    v = [rng.standard_normal((n, HKV, dv)) for n in lengths]
    cache = attn.KVCache(HKV, d, dv, page_size=page_size, dtype=dtype, group=group,
                         zero_point=zero_point, max_blocks=12)
    assert cache.zero_point == zero_point
    ids = [cache.add_sequence() for _ in lengths]
    for s, n in enumerate(lengths):
        slots = [table[s, t // page_size] * page_size + t % page_size for t in range(n)]
        attn.append_pages(k[s], v[s], slots, k_cache, v_cache, layout=layout,
                          key_scales=k_scales, value_scales=v_scales, **kind)
        cache.append(ids[s], k[s].transpose(1, 0, 2), v[s].transpose(1, 0, 2))
    q = rng.standard_normal((4, HQ, d)).astype(np.float32)
    query_start, seq_lens = np.array([0, 1, 4], np.int32), np.array(lengths, np.int32)
    out, lse = attn.paged_attention(q, k_cache, v_cache, table, seq_lens, query_start,
                                    layout=layout, key_scales=k_scales, value_scales=v_scales,
                                    return_lse=True, causal=True, **kind)
    for s, n in enumerate(lengths):
        rows = slice(query_start[s], query_start[s + 1])
        keys, values = (gathered(pool, None, table[s], n, page_size, layout)
                        for pool in (k_cache, v_cache))
        if int4:
            keys, values = int4_codes(keys.astype(np.uint8)), int4_codes(values.astype(np.uint8))
        def scaled(codes, scales, dim):
            coefficients = np.repeat(gathered(scales, None, table[s], n, page_size, layout),
                                     group, axis=2)
            if not zero_point:
                return codes.reshape(HKV, n, dim) * coefficients
            # code * scale + offset, rounded to float32 once (what the format defines)
            exact = codes.reshape(HKV, n, dim) * coefficients[..., 0] + coefficients[..., 1]
            return exact.astype(np.float32).astype(np.float64)

        keys, values = scaled(keys, k_scales, d), scaled(values, v_scales, dv)
        # Within a step of the row's largest magnitude (int8: half of one), or with zero
        # points half a step of its range, and far closer in the group without the outlier
        # channel.
        error = np.abs(keys - k[s].transpose(1, 0, 2))
        if zero_point:
            assert error.max() <= np.ptp(k[s]) / (30 if int4 else 510) + 1e-6
        else:
            assert error.max() <= np.abs(k[s]).max() / (8 if int4 else 254) + 1e-6
        assert error[:, :, :32].max() < (0.6 if int4 else 0.02)
        want_out, want_lse, _ = numpy_reference.attention(
            q[rows].astype(np.float64).transpose(1, 0, 2)[None], keys[None], values[None],
            causal=True, bottom_right=True)
        assert nmse(out[rows], want_out[0].transpose(1, 0, 2)) < 1e-11
        assert nmse(lse[rows], want_lse[0].T) < 1e-12
        alone = attn.decode(q[rows].transpose(1, 0, 2)[None], cache, [ids[s]], causal=True)
        kc, vc, ks, vs = cache.pools()
        assert ks.shape == (12, HKV, page_size, d // group) + pair
        pool_table, pool_lens = cache.block_tables([ids[s]])
        from_pools = attn.paged_attention(q[rows], kc, vc, pool_table, pool_lens,
                                          [0, query_start[s + 1] - query_start[s]],
                                          layout="head_major", key_scales=ks, value_scales=vs,
                                          causal=True, **kind)
        assert np.array_equal(from_pools, alone[0].transpose(1, 0, 2))
        assert np.array_equal(alone[0].transpose(1, 0, 2), out[rows])
    with pytest.raises(ValueError, match="^group: expected 0 \\(groups of scales are for int8"):
        attn.KVCache(HKV, d, dv, dtype="float16", group=32)
    with pytest.raises(ValueError, match="^key_scales: expected shape"):
        attn.paged_attention(q, k_cache, v_cache, table, seq_lens, query_start, layout=layout,
                             key_scales=np.zeros(shape + (3,), np.float32), value_scales=v_scales,
                             **kind)


@pytest.mark.parametrize("d,dv,group", [(40, 24, 0), (32, 64, 32)])
def test_zero_points_of_whole_rows_come_back_through_the_pools(d, dv, group):
    """An int8 KVCache with zero points and one pair a row (d 40: no group divides it), or
    keys of one group of 32 and values of two: its pools show [..., G, 2] pairs, which
    paged_attention reads back (G 1 as one pair a row), to the bits of decode over the cache
    and within float32's bound of float64 over what the cache holds; the keys read back
    within half a step of their row's range. zero_point is for int8 and int4 only, and a
    bool."""
    n = 50
    rng = np.random.default_rng(8)
    cache = attn.KVCache(HKV, d, dv, page_size=16, dtype="int8", group=group, zero_point=True,
                         max_blocks=6)
    seq = cache.add_sequence()
    k = rng.standard_normal((HKV, n, d)) + 3.0  # on one side of zero
    cache.append(seq, k, rng.standard_normal((HKV, n, dv)))
    error = np.abs(cache.keys(seq) - k)
    assert error.max() <= (k.max(axis=-1) - k.min(axis=-1)).max() / 510 + 1e-5
    kc, vc, ks, vs = cache.pools()
    groups = (d // group, dv // group) if group else (1, 1)
    assert ks.shape == (6, HKV, 16, groups[0], 2) and vs.shape == (6, HKV, 16, groups[1], 2)
    q = rng.standard_normal((1, HQ, d)).astype(np.float32)
    table, seq_lens = cache.block_tables([seq])
    from_pools = attn.paged_attention(q, kc, vc, table, seq_lens, [0, 1], layout="head_major",
                                      key_scales=ks, value_scales=vs)
    alone = attn.decode(q.transpose(1, 0, 2)[None], cache, [seq])
    assert np.array_equal(from_pools, alone[0].transpose(1, 0, 2))
    want, _, _ = numpy_reference.attention(
        q.astype(np.float64).transpose(1, 0, 2)[None], cache.keys(seq)[None].astype(np.float64),
        cache.values(seq)[None].astype(np.float64))
    assert nmse(from_pools, want[0].transpose(1, 0, 2)) < 1e-11
    with pytest.raises(ValueError, match="^zero_point: expected false for .* \\(zero points are "
                                         "for int8 and int4\\), given true"):
        attn.KVCache(HKV, d, dv, dtype="float16", zero_point=True)
    with pytest.raises(TypeError, match="^zero_point: expected a bool, given str"):
        attn.KVCache(HKV, d, dv, dtype="int8", zero_point="yes")


def test_kvcache_pools_are_the_caches_memory_read_only():
    cache = attn.KVCache(HKV, D, DV, page_size=4, dtype="float16", max_blocks=8)
    key_cache, value_cache, key_scales, value_scales = cache.pools()
    assert key_cache.shape == (8, HKV, 4, D) and value_cache.shape == (8, HKV, 4, DV)
    assert key_scales is None and value_scales is None
    assert not key_cache.flags.writeable and not value_cache.flags.writeable
    seq = cache.add_sequence()
    k = np.arange(HKV * 5 * D, dtype=np.float16).reshape(HKV, 5, D) / 64
    cache.append(seq, k, np.zeros((HKV, 5, DV), np.float16))
    table = cache.block_table(seq)
    assert np.array_equal(key_cache[table[0], :, :4], k[:, :4])  # seen after the append
    assert np.array_equal(key_cache[table[1], :, :1], k[:, 4:])
    assert np.shares_memory(key_cache, cache.pools()[0])
    del cache
    assert np.array_equal(key_cache[table[1], :, :1], k[:, 4:])  # the arrays keep it alive
    with pytest.raises(ValueError, match="^key_cache: expected a writable array"):
        attn.append_pages(np.ones((1, HKV, D)), np.ones((1, HKV, DV)), [0], key_cache,
                          value_cache, layout="head_major")


def test_kvcache_pools_refuse_a_cache_that_grows_or_has_no_dtype_yet():
    with pytest.raises(ValueError, match="^max_blocks: expected a cache made with max_blocks > 0"):
        attn.KVCache(HKV, D, dtype="float32").pools()
    with pytest.raises(ValueError, match="^max_blocks: expected"):
        attn.KVCache(HKV, D).pools()
    with pytest.raises(ValueError, match="^dtype: expected a cache whose storage dtype is known"):
        attn.KVCache(HKV, D, max_blocks=4).pools()
    cache = attn.KVCache(HKV, D, max_blocks=4)
    seq = cache.add_sequence()
    cache.append(seq, np.ones((HKV, 1, D), np.float16), np.ones((HKV, 1, D), np.float16))
    assert cache.pools()[0].dtype == np.float16  # decided by the first append
    with pytest.raises(ValueError, match="^seq_ids: expected ids of sequences in the cache"):
        cache.block_tables([seq, 7])
