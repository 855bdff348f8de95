"""attn.integrations.flash_attn against a float64 reference written from flash-attn's
documented semantics (bottom-right causal and windows, softcap, ALiBi 1-D and 2-D, GQA, odd
head dims, varlen with empty sequences, a KV cache dense and paged with in-place appends,
left padding, rotary in both layouts, +inf lse for rows that see no key), with flash-attn's
accuracy criterion: at most twice the error of the same computation done naively in the
input dtype."""

import math

import numpy_reference
import pytest
import torch

from attn.integrations.flash_attn import (flash_attn_func, flash_attn_kvpacked_func,
                                          flash_attn_qkvpacked_func, flash_attn_varlen_func,
                                          flash_attn_with_kvcache)

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None,
              dtype=torch.float64):
    """q: (B, Lq, H, D)  k, v: (B, Lk, Hkv, D) -> (out (B, Lq, H, Dv), lse (B, H, Lq)), in
    `dtype` (float64: the oracle; the input dtype: the naive computation). A row that sees
    no key: out 0, lse +inf, as flash-attn's kernel gives."""
    q, k, v = (x.to(dtype) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    len_q, len_k = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    position, key = (torch.from_numpy(x) for x in numpy_reference.positions(len_q, len_k, True))
    if alibi is not None:
        slopes = alibi if alibi.dim() == 2 else alibi[None].expand(q.shape[0], -1)
        s = s - slopes.to(dtype)[:, :, None, None] * (position - key).abs().to(dtype)
    visible = numpy_reference.visible_keys(len_q, len_k, causal=causal, window=window,
                                           bottom_right=True)
    s = s.masked_fill(~torch.from_numpy(visible), float("-inf"))
    lse = torch.logsumexp(s.to(torch.float64), dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return out, torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)


def inputs(batch, len_q, len_k, heads, heads_kv, dim, dtype, seed=0, dim_v=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, len_q, heads, dim, generator=g).to(dtype)
    k = torch.randn(batch, len_k, heads_kv, dim, generator=g).to(dtype)
    v = torch.randn(batch, len_k, heads_kv, dim_v or dim, generator=g).to(dtype)
    return q, k, v


def check_accuracy(got, q, k, v, q_exact=None, **semantics):
    """flash-attn's criterion against the oracle, with a floor for float32's rounding.
    q_exact: the queries before their rounding to q's dtype, where the oracle should have
    them (rotated queries)."""
    want, _ = reference(q if q_exact is None else q_exact, k, v, **semantics)
    naive, _ = reference(q, k, v, dtype=q.dtype if q.dtype != torch.float32 else torch.float32,
                         **semantics)
    assert not got.isnan().any()
    error = (got.to(torch.float64) - want).abs().max().item()
    naive_error = (naive.to(torch.float64) - want).abs().max().item()
    assert error <= 2 * naive_error + 1e-5, (error, naive_error)


CASES = [  # (len_q, len_k, heads, heads_kv, dim, causal, window, softcap, alibi)
    (17, 17, 4, 4, 64, False, (-1, -1), 0.0, None),
    (13, 29, 4, 2, 40, True, (-1, -1), 0.0, None),
    (29, 13, 4, 1, 33, True, (-1, -1), 0.0, "heads"),
    (21, 35, 6, 2, 24, False, (5, 3), 0.0, "batch"),
    (35, 35, 4, 2, 128, True, (8, 0), 30.0, None),
    (9, 40, 2, 2, 17, False, (-1, 6), 0.0, "batch"),
]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_flash_attn_func_matches_flash_attns_semantics(dtype, case):
    len_q, len_k, heads, heads_kv, dim, causal, window, softcap, alibi_kind = case
    q, k, v = inputs(2, len_q, len_k, heads, heads_kv, dim, DTYPES[dtype])
    alibi = {None: None, "heads": torch.rand(heads) * 0.3,
             "batch": torch.rand(2, heads) * 0.3}[alibi_kind]
    out, lse, probs = flash_attn_func(q, k, v, causal=causal, window_size=window,
                                      softcap=softcap, alibi_slopes=alibi,
                                      return_attn_probs=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, heads, len_q) and lse.dtype == torch.float32
    assert probs.shape == (2, heads, len_q, len_k)
    semantics = dict(causal=causal, window=window, softcap=softcap, alibi=alibi)
    check_accuracy(out, q, k, v, **semantics)
    _, want_lse = reference(q, k, v, **semantics)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isposinf(lse), torch.isposinf(want_lse))  # +inf: sees no key
    assert torch.allclose(lse.to(torch.float64)[finite], want_lse[finite], atol=1e-2, rtol=1e-3)
    assert torch.equal(flash_attn_func(q, k, v, causal=causal, window_size=window,
                                       softcap=softcap, alibi_slopes=alibi), out)


def test_rows_that_see_no_key_give_zero_and_plus_inf_lse():
    q, k, v = inputs(1, 6, 3, 2, 2, 16, torch.float32)  # rows 0-2 sit before the first key
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out[0, :3], torch.zeros_like(out[0, :3]))
    assert torch.isposinf(lse[0, :, :3]).all() and torch.isfinite(lse[0, :, 3:]).all()


def test_packed_forms_are_the_unpacked_call():
    q, k, v = inputs(2, 11, 11, 4, 4, 32, torch.bfloat16)
    want = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(flash_attn_qkvpacked_func(torch.stack([q, k, v], dim=2), causal=True), want)
    assert torch.equal(flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2), causal=True), want)


def test_gradients_match_the_reference():
    q, k, v = inputs(2, 19, 23, 4, 2, 32, torch.float32, seed=3)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = flash_attn_func(*leaves, causal=True, window_size=(7, 2), softcap=20.0,
                          alibi_slopes=torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]))
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [x.to(torch.float64).requires_grad_() for x in (q, k, v)]
    ref, _ = reference(*ref_leaves, causal=True, window=(7, 2), softcap=20.0,
                       alibi=torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]))
    want = torch.autograd.grad(ref, ref_leaves, dout.to(torch.float64))
    for g, w in zip(got, want):
        assert (g.to(torch.float64) - w).abs().max().item() < 1e-4


@pytest.mark.parametrize("alibi_kind", [None, "heads", "batch"])
def test_varlen_matches_each_sequence_alone(alibi_kind):
    lengths_q, lengths_k = [5, 0, 12, 7], [9, 4, 12, 0]
    heads, heads_kv, dim = 4, 2, 24
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sum(lengths_q), heads, dim, generator=g).to(torch.float16)
    k = torch.randn(sum(lengths_k), heads_kv, dim, generator=g).to(torch.float16)
    v = torch.randn(sum(lengths_k), heads_kv, dim, generator=g).to(torch.float16)
    cu_q = torch.tensor([0] + lengths_q).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lengths_k).cumsum(0).to(torch.int32)
    alibi = {None: None, "heads": torch.rand(heads) * 0.3,
             "batch": torch.rand(4, heads) * 0.3}[alibi_kind]
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                         causal=True, alibi_slopes=alibi,
                                         return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (heads, sum(lengths_q))
    for s in range(4):
        rows_q, rows_k = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        if lengths_q[s] == 0:
            continue
        slopes = None if alibi is None else (alibi if alibi.dim() == 1 else alibi[s:s + 1])
        check_accuracy(out[None, rows_q], q[None, rows_q], k[None, rows_k], v[None, rows_k],
                       causal=True, alibi=slopes)
        if lengths_k[s] == 0:
            assert torch.isposinf(lse[:, rows_q]).all()


def rotate(x, cos, sin, positions, interleaved):
    """flash-attn's rotary on x (tokens, heads, dim) at positions, float64."""
    x = x.to(torch.float64).clone()
    half = cos.shape[1]
    c = cos.to(torch.float64)[positions][:, None, :]
    s = sin.to(torch.float64)[positions][:, None, :]
    if interleaved:
        a, b = x[..., 0:2 * half:2].clone(), x[..., 1:2 * half:2].clone()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., :half].clone(), x[..., half:2 * half].clone()
        x[..., :half], x[..., half:2 * half] = a * c - b * s, b * c + a * s
    return x


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, "interleaved", "neox"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kvcache_appends_in_place_and_matches_the_reference(paged, rotary, dtype):
    torch_dtype = DTYPES[dtype]
    batch, heads, heads_kv, dim, seqlen_cache, new, len_q = 3, 4, 2, 32, 48, 3, 3
    g = torch.Generator().manual_seed(7)
    dense = torch.randn(batch, seqlen_cache, heads_kv, dim, generator=g).to(torch_dtype)
    dense_v = torch.randn(batch, seqlen_cache, heads_kv, dim, generator=g).to(torch_dtype)
    cache_seqlens = torch.tensor([5, 20, 0], dtype=torch.int32)
    cache_batch_idx = torch.tensor([2, 0, 1], dtype=torch.int32)
    q = torch.randn(batch, len_q, heads, dim, generator=g).to(torch_dtype)
    k_new = torch.randn(batch, new, heads_kv, dim, generator=g).to(torch_dtype)
    v_new = torch.randn(batch, new, heads_kv, dim, generator=g).to(torch_dtype)
    cos = sin = None
    if rotary:
        angles = torch.arange(64)[:, None] * 0.1 * torch.arange(1, 9)[None, :]
        cos, sin = angles.cos(), angles.sin()  # rotary_dim 16 of 32: partial
    kw = dict(k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=cache_seqlens,
              causal=True, rotary_interleaved=rotary == "interleaved", return_softmax_lse=True)
    if paged:
        page = 16
        order = torch.randperm(batch * seqlen_cache // page, generator=g).to(torch.int32)
        table = order.reshape(batch, seqlen_cache // page)
        k_cache = torch.empty(batch * seqlen_cache // page, page, heads_kv, dim, dtype=torch_dtype)
        v_cache = torch.empty_like(k_cache)
        for b in range(batch):
            for i in range(seqlen_cache // page):
                k_cache[table[b, i]] = dense[b, i * page:(i + 1) * page]
                v_cache[table[b, i]] = dense_v[b, i * page:(i + 1) * page]
        out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, block_table=table, **kw)
        rows = lambda c, b: torch.cat([c[p] for p in table[b]])  # noqa: E731
    else:
        k_cache, v_cache = dense.clone(), dense_v.clone()
        out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_batch_idx=cache_batch_idx,
                                           **kw)
        rows = lambda c, b: c[cache_batch_idx[b]]  # noqa: E731
    assert out.shape == q.shape and out.dtype == torch_dtype and lse.shape == (batch, heads, len_q)
    for b in range(batch):
        length = int(cache_seqlens[b])
        positions = torch.arange(length, length + new)
        want_k = k_new[b] if not rotary else rotate(k_new[b], cos, sin, positions,
                                                    rotary == "interleaved").to(torch_dtype)
        assert torch.equal(rows(k_cache, b)[length:length + new], want_k)  # appended in place
        assert torch.equal(rows(v_cache, b)[length:length + new], v_new[b])
        keys = rows(k_cache, b)[None, :length + new]
        values = rows(v_cache, b)[None, :length + new]
        exact = None
        if rotary:
            exact = rotate(q[b], cos, sin, torch.arange(length, length + len_q),
                           rotary == "interleaved")[None]
        check_accuracy(out[b:b + 1], q[b:b + 1] if exact is None else exact.to(torch_dtype),
                       keys, values, q_exact=exact, causal=True)


def test_unserved_arguments_are_refused_naming_them():
    q, k, v = inputs(1, 4, 4, 2, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="^cache_leftpad: expected None with block_table"):
        flash_attn_with_kvcache(q, k, v, cache_leftpad=torch.zeros(1, dtype=torch.int32),
                                block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="^cache_leftpad: expected values from 0 to cache_seqlens"):
        flash_attn_with_kvcache(q, k, v, cache_seqlens=2, cache_leftpad=torch.tensor([3]))
    with pytest.raises(ValueError, match=r"^cache_leftpad: expected an int or shape \(1,\)"):
        flash_attn_with_kvcache(q, k, v, cache_seqlens=2, cache_leftpad=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^alibi_slopes: expected shape \(2,\) or \(1, 2\)"):
        flash_attn_func(q, k, v, alibi_slopes=torch.ones(3))
    with pytest.raises(ValueError, match="^k: expected room in the cache"):
        flash_attn_with_kvcache(q, k.clone(), v.clone(), k=k, v=v, cache_seqlens=2)


def test_kvcache_without_new_tokens_rotates_queries_at_the_cache_length_and_takes_2d_alibi():
    """Not causal and no window: flash-attn rotates every query at cache_seqlens (one
    position); ALiBi slopes per batch entry; nothing appended."""
    batch, heads, heads_kv, dim, seqlen_cache, len_q = 2, 4, 2, 32, 24, 3
    g = torch.Generator().manual_seed(11)
    k_cache = torch.randn(batch, seqlen_cache, heads_kv, dim, generator=g)
    v_cache = torch.randn(batch, seqlen_cache, heads_kv, dim, generator=g)
    before = (k_cache.clone(), v_cache.clone())
    q = torch.randn(batch, len_q, heads, dim, generator=g)
    angles = torch.arange(32)[:, None] * 0.2 * torch.arange(1, 17)[None, :]
    lengths = torch.tensor([10, 17], dtype=torch.int32)
    alibi = torch.rand(batch, heads, generator=g) * 0.3
    out = flash_attn_with_kvcache(q, k_cache, v_cache, rotary_cos=angles.cos(),
                                  rotary_sin=angles.sin(), cache_seqlens=lengths,
                                  rotary_interleaved=False, alibi_slopes=alibi)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])
    for b in range(batch):
        length = int(lengths[b])
        exact = rotate(q[b], angles.cos(), angles.sin(), torch.full((len_q,), length), False)[None]
        check_accuracy(out[b:b + 1], exact.float(), k_cache[b:b + 1, :length],
                       v_cache[b:b + 1, :length], q_exact=exact, alibi=alibi[b:b + 1])


@pytest.mark.parametrize("rotary", [None, "neox"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kvcache_leftpad_reads_each_row_from_its_pad(rotary, dtype):
    """cache_leftpad: entry b's keys are rows [leftpad[b], cache_seqlens[b] + new), its new
    tokens written at cache_seqlens[b] (rotated there: rotary positions count from row 0),
    causal and ALiBi positions counted from leftpad[b], as flash-attn's kernel and tests."""
    torch_dtype = DTYPES[dtype]
    batch, heads, heads_kv, dim, seqlen_cache, new, len_q = 3, 4, 2, 32, 40, 2, 3
    g = torch.Generator().manual_seed(13)
    k_cache = torch.randn(batch, seqlen_cache, heads_kv, dim, generator=g).to(torch_dtype)
    v_cache = torch.randn(batch, seqlen_cache, heads_kv, dim, generator=g).to(torch_dtype)
    q = torch.randn(batch, len_q, heads, dim, generator=g).to(torch_dtype)
    k_new = torch.randn(batch, new, heads_kv, dim, generator=g).to(torch_dtype)
    v_new = torch.randn(batch, new, heads_kv, dim, generator=g).to(torch_dtype)
    lengths = torch.tensor([9, 30, 4], dtype=torch.int32)
    leftpad = torch.tensor([3, 0, 4], dtype=torch.int32)
    alibi = torch.rand(heads, generator=g) * 0.3
    cos = sin = None
    if rotary:
        angles = torch.arange(64)[:, None] * 0.1 * torch.arange(1, 17)[None, :]
        cos, sin = angles.cos(), angles.sin()
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, rotary_cos=cos,
                                  rotary_sin=sin, cache_seqlens=lengths, cache_leftpad=leftpad,
                                  causal=True, rotary_interleaved=False, alibi_slopes=alibi)
    for b in range(batch):
        length, pad = int(lengths[b]), int(leftpad[b])
        want_k = k_new[b] if not rotary else rotate(
            k_new[b], cos, sin, torch.arange(length, length + new), False).to(torch_dtype)
        assert torch.equal(k_cache[b, length:length + new], want_k)
        assert torch.equal(v_cache[b, length:length + new], v_new[b])
        exact = None
        if rotary:
            exact = rotate(q[b], cos, sin, torch.arange(length, length + len_q), False)[None]
        check_accuracy(out[b:b + 1], q[b:b + 1] if exact is None else exact.to(torch_dtype),
                       k_cache[b:b + 1, pad:length + new], v_cache[b:b + 1, pad:length + new],
                       q_exact=exact, causal=True, alibi=alibi)
