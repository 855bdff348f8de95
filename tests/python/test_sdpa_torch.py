"""attn.scaled_dot_product_attention beside torch.nn.functional.scaled_dot_product_attention
on PyTorch's own behaviours (the semantics its test_transformers.py checks): causal biases,
broadcasting, zero sizes, output strides, autocast, the inputs it refuses. Each case runs
both; where torch raises, attn must raise a RuntimeError too."""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
from torch.nn.attention.bias import causal_lower_right, causal_upper_left  # noqa: E402

import attn  # noqa: E402

LIMITS = {torch.float32: 2e-5, torch.float64: 1e-10, torch.float16: 4e-3, torch.bfloat16: 4e-2}


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _assert_same(got, want):
    assert isinstance(got, torch.Tensor)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    if want.numel():
        diff = (got.double() - want.double()).abs().max().item()
        assert diff <= LIMITS[want.dtype], f"max abs difference {diff:.3g}"


def _side_by_side(*args, **kwargs):
    """Runs both; returns attn's result, checked against torch's, or None when both refused."""
    try:
        want = F.scaled_dot_product_attention(*args, **kwargs)
    except (RuntimeError, IndexError, ValueError) as refused:
        with pytest.raises(RuntimeError):
            attn.scaled_dot_product_attention(*args, **kwargs)
        return refused
    got = attn.scaled_dot_product_attention(*args, **kwargs)
    _assert_same(got, want)
    return got


@pytest.mark.parametrize("lengths", [(3, 7), (7, 3), (5, 5), (1, 9)], ids=str)
@pytest.mark.parametrize("bias", [causal_upper_left, causal_lower_right], ids=lambda f: f.__name__)
def test_causal_biases_are_honoured(bias, lengths):
    len_q, len_k = lengths
    q, k, v = _randn(2, 3, len_q, 8), _randn(2, 3, len_k, 8, seed=1), _randn(2, 3, len_k, 4, seed=2)
    got = _side_by_side(q, k, v, attn_mask=bias(len_q, len_k))
    mask = bias(len_q, len_k)._materialize()  # the same mask as a plain bool tensor
    assert torch.equal(got, attn.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_a_causal_bias_of_other_lengths_is_refused():
    q = _randn(1, 2, 3, 4)
    with pytest.raises(attn.Error, match="causal bias"):
        attn.scaled_dot_product_attention(q, q, q, attn_mask=causal_lower_right(4, 3))


class Tagged(torch.Tensor):
    """A tensor subclass whose meaning attn cannot know."""


def test_other_tensor_subclasses_are_refused_and_parameters_read():
    q = _randn(2, 3, 4)
    with pytest.raises(attn.ArgumentTypeError, match="subclass Tagged"):
        attn.scaled_dot_product_attention(q.as_subclass(Tagged), q, q)
    with pytest.raises(attn.ArgumentTypeError, match="attn_mask: .*subclass Tagged"):
        attn.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(3, 3).as_subclass(Tagged))
    with torch.no_grad():
        _side_by_side(torch.nn.Parameter(q), q, q)


@pytest.mark.parametrize("mask_shape", [(2, 3, 5, 6), (5, 6), (2, 1, 1, 6), (3, 5, 1)], ids=str)
@pytest.mark.parametrize("with_qkv_grads", [False, True])
def test_a_float_mask_that_requires_grad_gets_torchs_gradient(mask_shape, with_qkv_grads):
    """A learned bias trains through attn as through PyTorch: the mask's gradient is dS,
    summed over the dims it broadcasts over (float64, so that the two agree closely)."""
    q, k, v = (_randn(2, 3, n, 4, dtype=torch.float64, seed=s) for s, n in ((0, 5), (1, 6), (2, 6)))
    mask = _randn(*mask_shape, dtype=torch.float64, seed=3)
    grads = {}
    for name, sdpa in (("attn", attn.scaled_dot_product_attention),
                       ("torch", F.scaled_dot_product_attention)):
        leaves = [x.clone().requires_grad_(with_qkv_grads) for x in (q, k, v)]
        bias = mask.clone().requires_grad_()
        out = sdpa(*leaves, attn_mask=bias)
        (out * out).sum().backward()
        grads[name] = [bias.grad] + ([x.grad for x in leaves] if with_qkv_grads else [])
    for got, want in zip(grads["attn"], grads["torch"]):
        assert got.shape == want.shape
        assert (got - want).abs().max().item() < 1e-10


def test_attention_gives_a_float_masks_gradient_in_every_layout_with_gqa():
    """attn.attention, bshd layout, grouped-query heads, a mask per query head, float32."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 7, h, 8, generator=g) for h in (4, 2, 2))  # [B, L, H, D]
    mask = torch.randn(4, 7, 7, generator=g).requires_grad_()
    out = attn.attention(q, k, v, mask=mask, layout="bshd", causal=True)
    (out * out).sum().backward()
    bias = mask.detach().double().requires_grad_()
    qt, kt, vt = (x.double().transpose(1, 2) for x in (q, k, v))
    kt, vt = (x.repeat_interleave(2, dim=1) for x in (kt, vt))
    hidden = torch.ones(7, 7, dtype=torch.bool).triu(1)
    want = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias.masked_fill(hidden, -torch.inf))
    (want * want).sum().backward()
    assert (mask.grad.double() - bias.grad).abs().max().item() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_memory_follows_the_query(dtype):
    batch, length, heads, dim = 2, 5, 3, 8
    q, k, v = (_randn(batch, length, heads, dim, dtype=dtype, seed=s).transpose(1, 2) for s in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = _side_by_side(q, k, v, is_causal=True)
    assert got.stride() == want.stride() == q.stride()
    merged = got.transpose(1, 2).view(batch, length, heads * dim)  # as transformers' models do
    _assert_same(merged, want.transpose(1, 2).reshape(batch, length, heads * dim))
    contiguous = _randn(batch, heads, length, dim)
    assert _side_by_side(contiguous, contiguous, contiguous).is_contiguous()


def test_numpy_output_memory_follows_the_query():
    q = np.random.default_rng(0).standard_normal((2, 5, 3, 8)).transpose(0, 2, 1, 3)
    out = attn.scaled_dot_product_attention(q, q, q)
    assert out.strides == q.strides and out.transpose(0, 2, 1, 3).flags.c_contiguous


def test_autocast_computes_in_its_dtype():
    q, k, v = _randn(2, 3, 6, 8), _randn(2, 3, 7, 8, seed=1), _randn(2, 3, 7, 8, seed=2)
    mask = _randn(6, 7, seed=3)
    with torch.autocast("cpu", torch.bfloat16):
        assert _side_by_side(q, k, v, attn_mask=mask).dtype == torch.bfloat16
        assert _side_by_side(q.double(), k.double(), v.double()).dtype == torch.float64
    assert _side_by_side(q, k, v).dtype == torch.float32


@dataclasses.dataclass(frozen=True)
class Shapes:
    q: tuple
    k: tuple
    v: tuple
    enable_gqa: bool = False


BROADCASTS = [
    Shapes((2, 3, 5, 4), (1, 1, 6, 4), (1, 1, 6, 4)),  # one K/V for every batch and head
    Shapes((2, 3, 5, 4), (2, 1, 6, 4), (2, 1, 6, 4)),  # Hkv = 1 without enable_gqa
    Shapes((1, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 4)),  # query's batch broadcast
    Shapes((2, 3, 5, 4), (2, 1, 6, 4), (2, 3, 6, 4)),  # key and value broadcast differently
    Shapes((3, 5, 4), (6, 4), (6, 4)),  # ranks differ
    Shapes((5, 4), (2, 3, 6, 4), (2, 3, 6, 4)),
    Shapes((2, 2, 3, 5, 4), (2, 1, 3, 6, 4), (1, 2, 3, 6, 4)),  # 5-D
    Shapes((2, 4, 5, 4), (1, 2, 6, 4), (1, 2, 6, 4), enable_gqa=True),  # GQA and batch broadcast
    Shapes((2, 4, 5, 4), (2, 2, 6, 4), (2, 2, 6, 4)),  # GQA heads without the flag: refused
    Shapes((2, 4, 5, 4), (2, 3, 6, 4), (2, 3, 6, 4), enable_gqa=True),  # 3 does not divide 4
    Shapes((2, 3, 5, 4), (3, 3, 6, 4), (3, 3, 6, 4)),  # batches 2 and 3 do not broadcast
    Shapes((2, 3, 5, 4), (2, 3, 6, 5), (2, 3, 6, 4)),  # E differs
]


@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_broadcasting_as_torch(shapes):
    q, k, v = _randn(*shapes.q), _randn(*shapes.k, seed=1), _randn(*shapes.v, seed=2)
    for is_causal in (False, True):
        _side_by_side(q, k, v, is_causal=is_causal, enable_gqa=shapes.enable_gqa)


ZERO_SIZES = [
    ((2, 0, 5, 4), (2, 0, 6, 4), (2, 0, 6, 4)),  # H = 0
    ((0, 3, 5, 4), (0, 3, 6, 4), (0, 3, 6, 4)),  # B = 0
    ((2, 3, 0, 4), (2, 3, 6, 4), (2, 3, 6, 4)),  # L = 0
    ((2, 3, 5, 4), (2, 3, 0, 4), (2, 3, 0, 4)),  # S = 0: zeros
    ((2, 3, 5, 0), (2, 3, 6, 0), (2, 3, 6, 4)),  # E = 0: every key weighs the same
    ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 0)),  # Ev = 0
]


@pytest.mark.parametrize("shapes", ZERO_SIZES, ids=str)
def test_zero_sizes_as_torch(shapes):
    q, k, v = _randn(*shapes[0]), _randn(*shapes[1], seed=1), _randn(*shapes[2], seed=2)
    _side_by_side(q, k, v)
    _side_by_side(q, k, v, is_causal=True)
    _side_by_side(q, k, v, scale=2.0)
    mask = torch.ones(shapes[0][2], shapes[1][2], dtype=torch.bool).tril()
    _side_by_side(q, k, v, attn_mask=mask)


def test_scale_may_be_a_0d_tensor():
    q, k = _randn(2, 3, 5, 8), _randn(2, 3, 6, 8, seed=1)
    got = _side_by_side(q, k, k, scale=torch.tensor(0.3))
    assert torch.equal(got, attn.scaled_dot_product_attention(q, k, k, scale=0.3))


@pytest.mark.parametrize("case", ["mixed dtypes", "1-D mask", "float64 mask", "float16 mask",
                                  "int mask", "5-D mask", "causal and mask"])
def test_refused_where_torch_raises(case):
    q = _randn(2, 3, 5, 4)
    args, kwargs = [q, q, q], {}
    if case == "mixed dtypes":
        args[1] = q.double()
    elif case == "causal and mask":
        kwargs = dict(attn_mask=torch.ones(5, 5, dtype=torch.bool), is_causal=True)
    else:
        kwargs["attn_mask"] = {
            "1-D mask": torch.ones(5, dtype=torch.bool), "float64 mask": torch.zeros(5, 5, dtype=torch.float64),
            "float16 mask": torch.zeros(5, 5, dtype=torch.float16), "int mask": torch.zeros(5, 5, dtype=torch.int64),
            "5-D mask": torch.ones(1, 1, 1, 5, 5, dtype=torch.bool)}[case]
    assert isinstance(_side_by_side(*args, **kwargs), Exception), "torch accepted it"


def test_errors_are_runtime_errors_and_what_they_were():
    assert issubclass(attn.Error, ValueError) and issubclass(attn.Error, RuntimeError)
    assert issubclass(attn.ArgumentTypeError, TypeError)
    assert issubclass(attn.ArgumentTypeError, RuntimeError)
    q, k = np.zeros((1, 3, 4, 8), np.float32), np.zeros((1, 2, 4, 8), np.float32)
    with pytest.raises(attn.Error, match="heads"):  # refused by the extension
        attn.attention(q, k, k)
    with pytest.raises(attn.ArgumentTypeError, match="causal"):
        attn.attention(q, q, q, causal=1)


def test_nan_in_query_propagates():
    """A deliberate difference: PyTorch's CPU kernel may give zeros for a query row holding
    NaN; attn gives NaN in that row and only there."""
    q, k = _randn(1, 2, 4, 8), _randn(1, 2, 6, 8, seed=1)
    q[0, 1, 2, 3] = float("nan")
    got = attn.scaled_dot_product_attention(q, k, k)
    assert torch.isnan(got[0, 1, 2]).all()
    finite = torch.ones(got.shape[:-1], dtype=torch.bool)
    finite[0, 1, 2] = False
    _assert_same(got[finite], F.scaled_dot_product_attention(q, k, k)[finite])


def _grads_side_by_side(query, key, value, **kwargs):
    """The gradients of sum(out * w) through attn's and torch's SDPA, compared."""
    grads = []
    for sdpa in (attn.scaled_dot_product_attention, F.scaled_dot_product_attention):
        leaves = [x.detach().requires_grad_() for x in (query, key, value)]
        out = sdpa(*leaves, **kwargs)
        out.backward(_randn(*out.shape, seed=7, dtype=out.dtype))
        grads.append([x.grad for x in leaves])
    for got, want in zip(*grads):
        _assert_same(got, want)


GRADIENT_CASES = {
    "plain": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), {}),
    "is_causal": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), dict(is_causal=True)),
    "causal_lower_right": ((1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8),
                           dict(attn_mask=causal_lower_right(5, 7))),
    "float_mask": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), dict(attn_mask=_randn(5, 7, seed=5))),
    "bool_mask": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4),
                  dict(attn_mask=_randn(2, 1, 5, 7, seed=5) > -1)),
    "broadcast_heads": ((2, 4, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8), {}),  # MQA without enable_gqa
    "broadcast_batch": ((3, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), {}),
    "enable_gqa": ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), dict(enable_gqa=True)),
    "three_dims": ((3, 5, 8), (3, 7, 8), (3, 7, 4), dict(scale=0.2)),
}


@pytest.mark.parametrize("case", GRADIENT_CASES)
def test_gradients_match_torch(case):
    q_shape, k_shape, v_shape, kwargs = GRADIENT_CASES[case]
    _grads_side_by_side(_randn(*q_shape), _randn(*k_shape, seed=1), _randn(*v_shape, seed=2), **kwargs)


def test_gradients_of_bshd_views_match_torch_and_keep_the_layout():
    """The Hugging Face pattern: [B, L, H, E] memory seen as [B, H, L, E]."""
    q, k, v = (_randn(2, 6, 3, 8, seed=s).transpose(1, 2) for s in range(3))
    _grads_side_by_side(q, k, v, is_causal=True)
    leaf = q.detach().requires_grad_()
    out = attn.scaled_dot_product_attention(leaf, k, v)
    assert out.grad_fn is not None
    out.transpose(1, 2).view(2, 6, 24)  # the output's memory is [B, L, H, Ev], as torch's


def test_gradcheck_through_broadcasting_and_gqa():
    q = _randn(2, 4, 3, 5, dtype=torch.float64).requires_grad_()
    k = _randn(1, 2, 4, 5, seed=1, dtype=torch.float64).requires_grad_()
    v = _randn(1, 2, 4, 3, seed=2, dtype=torch.float64).requires_grad_()

    def run(q, k, v):
        return attn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.autograd.gradcheck(run, (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_zero_sizes_give_zero_gradients():
    q = _randn(2, 3, 0, 8).requires_grad_()
    k, v = _randn(2, 3, 4, 8, seed=1).requires_grad_(), _randn(2, 3, 4, 5, seed=2).requires_grad_()
    attn.scaled_dot_product_attention(q, k, v).sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(v.grad, torch.zeros_like(v))
