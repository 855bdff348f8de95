"""Dropout (dropout_p, dropout_seed) from Python: attn.dropout_mask is the documented rule
(written again here from src/core/dropout.hpp's comment), forward and backward drop exactly
it (against float64 formulas), the seed comes from torch's or NumPy's generator and repeats
with it, and SDPA, flash-attn's functions, torch.compile and transformers' training take it.
The C++ side (every kernel target, thread counts, the case list): tests/dropout_test.cpp."""

import math

import numpy as np
import pytest
import torch

import attn
import numpy_reference
from attn.integrations.flash_attn import flash_attn_func, flash_attn_varlen_func

M64 = (1 << 64) - 1


def _mix64(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def _mix32(x):
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def documented_mask(shape, p, seed):
    """The keep rule as src/core/dropout.hpp states it, in NumPy."""
    batch, heads, len_q, len_k = shape
    keys = np.arange(len_k, dtype=np.uint32)
    threshold = math.ceil(p * 2**24)
    out = np.empty(shape, bool)
    for b in range(batch):
        for h in range(heads):
            for i in range(len_q):
                x = _mix64(seed)
                for index in (b, h, i):
                    x = _mix64(x ^ index)
                low, high = np.uint32(x & 0xFFFFFFFF), np.uint32(x >> 32)
                bits = _mix32(_mix32(low ^ (keys * np.uint32(0x9E3779B9))) ^ high) >> np.uint32(8)
                out[b, h, i] = bits >= threshold
    return out


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.97, 1.0])
def test_dropout_mask_is_the_documented_rule(p):
    for seed in (0, 12345, 2**64 - 1):
        got = attn.dropout_mask((2, 3, 5, 70), p, seed)
        assert got.dtype == np.bool_ and got.shape == (2, 3, 5, 70)
        np.testing.assert_array_equal(got, documented_mask((2, 3, 5, 70), p, seed))


def _inputs(batch, heads_q, heads_kv, len_q, len_k, dim, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, heads_q, len_q, dim))
    k = rng.standard_normal((batch, heads_kv, len_k, dim))
    v = rng.standard_normal((batch, heads_kv, len_k, dim))
    return q, k, v


def _dropped(weights, v, mask, p):
    """(weights * mask / (1 - p)) v in float64, v repeated over the query heads' groups."""
    group = weights.shape[1] // v.shape[1]
    z = np.where(mask, 1.0 / (1.0 - p) if p < 1 else 0.0, 0.0)
    return np.einsum("bhqk,bhkd->bhqd", weights * z, np.repeat(v, group, axis=1))


def _nmse(got, want):
    return float(np.sum((np.asarray(got, np.float64) - want) ** 2) / np.sum(want ** 2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_drops_the_masks_weights(dtype, causal):
    p, seed = 0.3, 99
    q, k, v = _inputs(2, 4, 2, 37, 97, 40)
    want, _, weights = numpy_reference.attention(q, k, v, causal=causal, bottom_right=True)
    mask = attn.dropout_mask(weights.shape, p, seed)
    want = _dropped(weights, v, mask, p)
    out, lse = attn.attention(*(x.astype(dtype) for x in (q, k, v)), causal=causal,
                              causal_align="bottom-right", dropout_p=p, dropout_seed=seed,
                              return_lse=True)
    assert _nmse(out, want) < (1e-12 if dtype == np.float32 else 1e-24)
    undropped_lse = attn.attention(*(x.astype(dtype) for x in (q, k, v)), causal=causal,
                                   causal_align="bottom-right", return_lse=True)[1]
    np.testing.assert_array_equal(lse, undropped_lse)  # lse is the softmax's, before dropout


def test_packed_sequences_drop_by_the_packed_rows_and_columns():
    p, seed = 0.4, 7
    q, k, v = _inputs(1, 2, 2, 30, 50, 16)
    cu_q, cu_k = [0, 10, 30], [0, 25, 50]
    out = attn.attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                         cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True,
                         causal_align="bottom-right", dropout_p=p, dropout_seed=seed)
    mask = attn.dropout_mask((1, 2, 30, 50), p, seed)
    for s in range(2):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        _, _, weights = numpy_reference.attention(q[:, :, rows], k[:, :, keys], v[:, :, keys],
                                                  causal=True, bottom_right=True)
        want = _dropped(weights, v[:, :, keys], mask[:, :, rows, keys], p)
        assert _nmse(out[:, :, rows], want) < 1e-12


def test_backward_is_the_gradient_of_the_dropped_formula():
    p, seed = 0.25, 4242
    q, k, v = (torch.from_numpy(x) for x in _inputs(2, 4, 2, 19, 33, 24, seed=1))
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    sinks = torch.tensor([0.5, -1.0, 0.0, 2.0], requires_grad=True)
    out = attn.attention(*leaves, causal=True, sinks=sinks, dropout_p=p, dropout_seed=seed)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, [*leaves, sinks], dout)

    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    ref_sinks = sinks.detach().double().requires_grad_()
    rq, rk, rv = ref_leaves
    rk, rv = (x.repeat_interleave(2, dim=1) for x in (rk, rv))
    s = torch.einsum("bhqd,bhkd->bhqk", rq, rk) / math.sqrt(24)
    s = s.masked_fill(torch.ones(19, 33, dtype=torch.bool).triu(1), float("-inf"))
    s_with_sink = torch.cat([s, ref_sinks[None, :, None, None].expand(2, 4, 19, 1)], dim=-1)
    weights = torch.softmax(s_with_sink, dim=-1)[..., :-1]
    kept = torch.from_numpy(attn.dropout_mask((2, 4, 19, 33), p, seed))
    want_out = torch.einsum("bhqk,bhkd->bhqd", weights * kept / (1 - p), rv)
    assert (out.double() - want_out).abs().max().item() < 1e-5
    want = torch.autograd.grad(want_out, [*ref_leaves, ref_sinks], dout.double())
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        assert (g.double() - w).abs().max().item() < 1e-4, name


def test_attention_backward_needs_the_forwards_seed():
    q, k, v = (x.astype(np.float32) for x in _inputs(1, 2, 2, 5, 5, 8))
    out, lse = attn.attention(q, k, v, dropout_p=0.5, dropout_seed=3, return_lse=True)
    with pytest.raises(attn.Error, match="^dropout_seed: expected the forward call's seed"):
        attn.attention_backward(q, k, v, out, lse, out, dropout_p=0.5)
    attn.attention_backward(q, k, v, out, lse, out, dropout_p=0.5, dropout_seed=3)


@pytest.mark.parametrize("bad, message", [
    (dict(dropout_p=1.5), "^dropout_p: expected a probability in \\[0, 1\\]"),
    (dict(dropout_p=-0.1), "^dropout_p: expected a probability in \\[0, 1\\]"),
    (dict(dropout_p=0.1, dropout_seed=-1), "^dropout_seed: expected an int from 0"),
])
def test_bad_dropout_arguments_are_named(bad, message):
    q, k, v = (x.astype(np.float32) for x in _inputs(1, 2, 2, 5, 5, 8))
    with pytest.raises(attn.Error, match=message):
        attn.attention(q, k, v, **bad)


def test_decode_refuses_dropout():
    cache = attn.KVCache(1, 8)
    ids = cache.add_sequence()
    k = np.ones((1, 3, 8), np.float32)
    cache.append(ids, k, k)
    with pytest.raises(attn.Error, match="^dropout_p: expected 0 \\(decode"):
        attn.decode(np.ones((1, 1, 8), np.float32), cache, [ids], dropout_p=0.1)


def test_numpy_inputs_draw_the_seed_from_numpys_generator():
    q, k, v = (x.astype(np.float32) for x in _inputs(1, 2, 2, 9, 9, 8))
    np.random.seed(11)
    a = attn.attention(q, k, v, dropout_p=0.5)
    np.random.seed(11)
    b = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    np.random.seed(12)
    c = attn.attention(q, k, v, dropout_p=0.5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    np.testing.assert_array_equal(attn.scaled_dot_product_attention(q, k, v, dropout_p=0.0),
                                  attn.scaled_dot_product_attention(q, k, v))


def _sdpa_step(q, k, v, seed):
    torch.manual_seed(seed)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attn.scaled_dot_product_attention(*leaves, dropout_p=0.2, is_causal=True,
                                            enable_gqa=True)
    out.square().sum().backward()
    return out.detach(), [x.grad for x in leaves]


def test_sdpa_repeats_with_torchs_seed_and_differs_without():
    q, k, v = (torch.from_numpy(x).float() for x in _inputs(2, 4, 2, 16, 16, 32))
    out, grads = _sdpa_step(q, k, v, 0)
    again, grads_again = _sdpa_step(q, k, v, 0)
    other, _ = _sdpa_step(q, k, v, 1)
    assert torch.equal(out, again) and not torch.equal(out, other)
    for g, h in zip(grads, grads_again):
        assert torch.equal(g, h)


def test_sdpa_drops_the_expected_share_of_weights():
    """v the identity: the output is the weights times dropout's factors, so the share of
    zeros among the weights is the share dropped."""
    p, keys = 0.3, 64
    q = torch.randn(4, 8, 32, 16)
    k = torch.randn(4, 8, keys, 16)
    v = torch.eye(keys).expand(4, 8, keys, keys)
    out = attn.scaled_dot_product_attention(q, k, v, dropout_p=p)
    weights = attn.scaled_dot_product_attention(q, k, v)
    n = out.numel()
    dropped = (out == 0).double().mean().item()
    assert abs(dropped - p) < 6 * math.sqrt(p * (1 - p) / n)
    kept = out != 0
    assert torch.allclose(out[kept], weights[kept] / (1 - p), rtol=1e-5)


def test_flash_attn_returns_s_dmask_and_its_gradients_follow_it():
    p = 0.35
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 13, heads, 32, generator=g) for heads in (4, 2, 2))
    alibi = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    torch.manual_seed(0)
    out, lse, s_dmask = flash_attn_func(*leaves, dropout_p=p, causal=True, alibi_slopes=alibi,
                                        return_attn_probs=True)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, dout)
    torch.manual_seed(0)
    assert torch.equal(flash_attn_func(q, k, v, dropout_p=p, causal=True, alibi_slopes=alibi),
                       out)
    kept = ~torch.signbit(s_dmask)
    visible = s_dmask != 0
    share = (~kept & visible).sum().item() / visible.sum().item()
    assert 0.2 < share < 0.5  # about p of the visible weights

    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    rk, rv = (x.repeat_interleave(2, dim=2) for x in ref_leaves[1:])
    s = torch.einsum("bqhd,bkhd->bhqk", ref_leaves[0], rk) / math.sqrt(32)
    distance = (torch.arange(13)[:, None] - torch.arange(13)[None, :]).abs()
    s = s - alibi.double()[:, :, None, None] * distance
    s = s.masked_fill(torch.ones(13, 13, dtype=torch.bool).triu(1), float("-inf"))
    weights = torch.softmax(s, dim=-1)
    assert (s_dmask.abs().double() - weights.detach()).abs().max().item() < 1e-6
    want_out = torch.einsum("bhqk,bkhd->bqhd", weights * kept / (1 - p), rv)
    assert (out.double() - want_out).abs().max().item() < 1e-5
    want = torch.autograd.grad(want_out, ref_leaves, dout.double())
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert (g.double() - w).abs().max().item() < 1e-4, name


def test_flash_attn_varlen_takes_dropout():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(20, 2, 16, generator=g) for _ in range(3))
    cu = torch.tensor([0, 8, 20], dtype=torch.int32)
    torch.manual_seed(3)
    out = flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, dropout_p=0.5, causal=True)
    torch.manual_seed(3)
    again = flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, dropout_p=0.5, causal=True)
    plain = flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, causal=True)
    assert torch.equal(out, again) and not torch.equal(out, plain)


def test_compiled_training_step_with_dropout_matches_eager():
    """aot_eager draws the graph's seed from torch's generator as eager does, so a compiled
    step with dropout gives eager's output and gradients for the same torch.manual_seed."""
    q, k, v = (torch.from_numpy(x).float() for x in _inputs(2, 4, 4, 16, 16, 32))

    def step(q, k, v):
        out = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
        return out.square().sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    results = []
    for f in (step, compiled):
        torch.manual_seed(8)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        loss = f(*leaves)
        loss.backward()
        results.append((loss.detach(), [x.grad for x in leaves]))
    assert torch.equal(results[0][0], results[1][0])
    for g, h in zip(results[0][1], results[1][1]):
        assert torch.equal(g, h)
