"""attn.attention_backward and autograd through attn.attention: the gradients checked by
torch.autograd.gradcheck (central finite differences of attn's float64 forward) on every
option, the float32 / float16 / bfloat16 kernels against the float64 gradients, thread
counts, NumPy beside torch, and the argument errors."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attn  # noqa: E402

HEADS_Q, HEADS_KV = 2, 1


def _randn(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _mask(len_q, len_k, kind):
    visible = _randn(HEADS_Q, len_q, len_k, seed=9) > -0.8
    if kind == "bool":
        return visible
    return torch.where(visible, _randn(HEADS_Q, len_q, len_k, seed=8), -torch.inf)


# Each case: the keywords of attn.attention, and (Lq, Lk) when not the default.
CASES = {
    "plain": {},
    "scale": dict(scale=0.3),
    "causal_top_left": dict(causal=True),
    "causal_bottom_right": dict(causal=True, causal_align="bottom-right"),
    "window": dict(window=(2, 1)),
    "window_causal_bottom_right": dict(window=(3, -1), causal=True, causal_align="bottom-right"),
    "softcap": dict(softcap=1.5),
    "alibi": dict(alibi_slopes=[0.5, 0.25]),
    "sinks": dict(sinks=[0.3, -1.0]),
    "bool_mask": dict(mask="bool"),
    "additive_mask": dict(mask="additive"),
    "everything": dict(causal=True, causal_align="bottom-right", window=(4, -1), softcap=2.0,
                       alibi_slopes=[0.5, 0.25], sinks=[0.3, -1.0], mask="additive"),
    "packed": dict(cu_seqlens_q=[0, 2, 5], cu_seqlens_k=[0, 4, 7], causal=True,
                   causal_align="bottom-right"),
}


def _case(name, dtype=torch.float64, len_q=5, len_k=7, dim=4, dim_v=3, batch=1):
    """q, k, v (leaves that require grad), and attention's keywords for case `name`."""
    keywords = dict(CASES[name])
    if "mask" in keywords:
        keywords["mask"] = _mask(len_q, len_k, keywords["mask"])
    q = _randn(batch, HEADS_Q, len_q, dim, seed=1, dtype=dtype).requires_grad_()
    k = _randn(batch, HEADS_KV, len_k, dim, seed=2, dtype=dtype).requires_grad_()
    v = _randn(batch, HEADS_KV, len_k, dim_v, seed=3, dtype=dtype).requires_grad_()
    return q, k, v, keywords


@pytest.mark.parametrize("name", CASES)
def test_gradcheck_on_every_option(name):
    q, k, v, keywords = _case(name)

    def run(q, k, v):
        return attn.attention(q, k, v, **keywords)
    inputs = (q, k, v)
    assert torch.autograd.gradcheck(run, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_the_sinks_gradient_is_the_derivative_of_the_loss():
    """Central differences in the sinks (which the kernel reads as float32, so the step is
    large enough for float32 to hold it) against the sinks' gradient."""
    q, k, v, keywords = _case("everything")
    sinks = torch.tensor(keywords.pop("sinks"), dtype=torch.float64, requires_grad=True)
    attn.attention(q, k, v, sinks=sinks, **keywords).sum().backward()
    step = 2.0**-10
    for h in range(HEADS_Q):
        up, down = sinks.detach().clone(), sinks.detach().clone()
        up[h] += step
        down[h] -= step
        with torch.no_grad():
            slope = (attn.attention(q, k, v, sinks=up, **keywords).sum() -
                     attn.attention(q, k, v, sinks=down, **keywords).sum()) / (2 * step)
        assert abs(sinks.grad[h].item() - slope.item()) < 1e-5


def _gradients(q, k, v, keywords, dout, threads=None):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = attn.attention(q, k, v, threads=threads, **keywords)
    out.backward(dout.to(out.dtype))
    return q.grad, k.grad, v.grad


def _nmse(got, want):
    got, want = got.double(), want.double()
    assert torch.isfinite(got).all()
    return ((got - want).square().sum() / want.square().sum().clamp_min(1e-300)).item()


NMSE_LIMITS = {torch.float32: 1e-10, torch.float16: 1e-5, torch.bfloat16: 3e-4}


@pytest.mark.parametrize("dtype", NMSE_LIMITS, ids=str)
@pytest.mark.parametrize("name", [n for n in CASES if n != "packed"])
def test_low_precision_gradients_match_float64(name, dtype):
    """The fast kernel in float32 and in half precision against the float64 gradients of
    the same (rounded) inputs."""
    q, k, v, keywords = _case(name, dtype, len_q=33, len_k=70, dim=40, dim_v=24, batch=2)
    dout = _randn(2, HEADS_Q, 33, 24, seed=4)
    want = _gradients(*(x.double() for x in (q, k, v)), keywords, dout)
    got = _gradients(q, k, v, keywords, dout)
    for which, g, w in zip("qkv", got, want):
        assert g.dtype == dtype
        assert _nmse(g, w) < NMSE_LIMITS[dtype], f"d{which}"


def test_gradients_do_not_depend_on_the_thread_count():
    q, k, v, keywords = _case("everything", torch.float32, len_q=150, len_k=170, dim=64, dim_v=64)
    dout = _randn(1, HEADS_Q, 150, 64, seed=4, dtype=torch.float32)
    first = _gradients(q, k, v, keywords, dout, threads=1)
    for threads in (2, 3):
        for a, b in zip(first, _gradients(q, k, v, keywords, dout, threads=threads)):
            assert torch.equal(a, b)


def test_numpy_and_torch_give_the_same_gradients():
    q, k, v, keywords = _case("everything", torch.float32, len_q=9, len_k=12)
    dout = _randn(1, HEADS_Q, 9, 3, seed=4, dtype=torch.float32)
    dq, dk, dv = _gradients(q, k, v, keywords, dout)
    arrays = [x.detach().numpy() for x in (q, k, v)]
    numpy_keywords = {n: (x.numpy() if torch.is_tensor(x) else x) for n, x in keywords.items()}
    out, lse = attn.attention(*arrays, return_lse=True, **numpy_keywords)
    grads = attn.attention_backward(*arrays, out, lse, dout.numpy(), **numpy_keywords)
    assert len(grads) == 4  # the sinks' gradient too
    for got, want in zip(grads, (dq, dk, dv)):
        assert isinstance(got, np.ndarray) and np.array_equal(got, want.numpy())
    assert grads[3].shape == (HEADS_Q,) and grads[3].dtype == np.float32


@pytest.mark.parametrize("rank", [2, 3, 4])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gradients_follow_rank_and_layout(layout, rank):
    """Inputs of any rank, in either layout, get the gradients of the same attention in
    4-D bhsd, in their own shapes."""
    q, k, v = (_randn(1, 2, 6, dim, seed=seed) for seed, dim in ((1, 4), (2, 4), (3, 3)))
    if rank == 2:
        q, k, v = (x[:, :1] for x in (q, k, v))
    want = _gradients(q, k, v, dict(causal=True), torch.ones(1, q.shape[1], 6, 3))

    def user(x):  # 4-D bhsd -> the caller's rank and layout
        x = x.detach()
        if rank == 2:
            return x[0, 0].clone()
        if layout == "bshd":
            x = x.transpose(1, 2)
        return x[(0,) * (4 - rank)].contiguous()

    q_u, k_u, v_u = (user(x).requires_grad_() for x in (q, k, v))
    out = attn.attention(q_u, k_u, v_u, causal=True, layout=layout)
    out.sum().backward()
    for got, w in zip((q_u.grad, k_u.grad, v_u.grad), want):
        assert torch.equal(user(w), got)


def test_lse_and_weights_come_back_without_gradient():
    q, k, v, keywords = _case("causal_top_left")
    out, lse, weights = attn.attention(q, k, v, return_lse=True, return_weights=True, **keywords)
    assert out.grad_fn is not None
    assert not lse.requires_grad and not weights.requires_grad
    out.sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_bad_arguments_name_themselves():
    q, k, v, _ = _case("plain")
    q, k, v = (x.detach().numpy() for x in (q, k, v))
    out, lse = attn.attention(q, k, v, return_lse=True)
    with pytest.raises(attn.Error, match="^lse: expected 3 dims"):
        attn.attention_backward(q, k, v, out, lse[..., None], out)
    with pytest.raises(attn.Error, match="dout"):
        attn.attention_backward(q, k, v, out, lse, out[..., :2])
    with pytest.raises(attn.Error, match="out"):
        attn.attention_backward(q, k, v, out[:, :, :3], lse, out)
    with pytest.raises(attn.ArgumentTypeError, match="^dout"):
        attn.attention_backward(q, k, v, out, lse, "not an array")
    slopes = torch.zeros(q.shape[1], dtype=torch.float64, requires_grad=True)
    with pytest.raises(NotImplementedError, match="^alibi_slopes: requires_grad=True"):
        attn.attention(torch.from_numpy(q).requires_grad_(), torch.from_numpy(k),
                       torch.from_numpy(v), alibi_slopes=slopes)
