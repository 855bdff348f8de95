"""attn.contributions against float64: over the case list, alpha_ij ||v_j|| from
attn.weights' bits and float64 norms, rounded once (float32: equal to the bit); against the
float64 reference weights within the weights' tolerance; with an output projection, against
the norm of alpha_ij v_j W_O^h formed whole in float64."""

import numpy as np
import pytest
import torch

import attn
from cases import assert_close, case_list, make_inputs, reference_output

CASES = case_list()


def user_form(case, x4):
    """A [B, H, Lq, Lk] result in the case's rank (weights keep bhsd order)."""
    if case.rank == 4:
        return x4
    if case.rank == 3:
        return x4[0]
    return x4[0, 0]


def value_norms(v4, heads_q):
    """||v_j|| in float64 per query head: [B, Hq, 1, Lk]."""
    norms = np.sqrt((v4.astype(np.float64) ** 2).sum(axis=-1))
    return np.repeat(norms, heads_q // v4.shape[1], axis=1)[:, :, None, :]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_contributions_are_the_weights_times_the_value_norms(case):
    q, k, v, kwargs, ref_inputs = make_inputs(case)
    v4 = ref_inputs[2]
    got = attn.contributions(q, k, v, **kwargs)
    weights = attn.weights(q, k, **kwargs)
    norms = user_form(case, value_norms(v4, case.heads_q))
    exact = weights.astype(np.float64) * norms
    assert got.dtype == weights.dtype and got.shape == weights.shape
    if got.dtype == np.float32:
        assert np.array_equal(got, exact.astype(got.dtype))  # the product rounded once
    else:  # float64: the norms' sums in another order than NumPy's pairwise ones
        np.testing.assert_allclose(got, exact, rtol=1e-15, atol=0)
    _, _, want_weights = reference_output(case, ref_inputs)
    assert_close(got, want_weights * norms, case.dtype, "contributions")


def test_output_projection_matches_the_whole_product_in_float64():
    rng = np.random.default_rng(4)
    heads_q, heads_kv, len_q, len_k, dim, dim_v, width = 4, 2, 5, 7, 8, 6, 10
    q = rng.standard_normal((2, heads_q, len_q, dim)).astype(np.float32)
    k = rng.standard_normal((2, heads_kv, len_k, dim)).astype(np.float32)
    v = rng.standard_normal((2, heads_kv, len_k, dim_v)).astype(np.float32)
    w_o = rng.standard_normal((heads_q, dim_v, width)).astype(np.float32)
    got = attn.contributions(q, k, v, output_projection=w_o, causal=True, heads=[3, 0],
                             rows=[4, 1, 2])
    alpha = attn.weights(q, k, causal=True, heads=[3, 0], rows=[4, 1, 2]).astype(np.float64)
    v_by_head = np.repeat(v.astype(np.float64), heads_q // heads_kv, axis=1)[:, [3, 0]]
    projected = np.einsum("bhjd,hde->bhje", v_by_head, w_o.astype(np.float64)[[3, 0]])
    whole = alpha[..., None] * projected[:, :, None, :, :]  # [B, h, rows, Lk, E]
    want = np.sqrt((whole ** 2).sum(axis=-1))
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)


def test_torch_in_torch_out_and_a_small_value_contributes_little():
    q = torch.zeros(1, 2, 4)  # equal scores: alpha = 1/2 for both keys
    k = torch.randn(1, 2, 4)
    v = torch.tensor([[[3.0, 4.0], [0.03, 0.04]]])
    got = attn.contributions(q, k, v)
    assert isinstance(got, torch.Tensor) and got.shape == (1, 2, 2)
    torch.testing.assert_close(got[0, 0], torch.tensor([2.5, 0.025]))


def test_bad_arguments_are_named():
    q = np.zeros((2, 3, 4), np.float32)
    k = v = np.zeros((2, 5, 4), np.float32)
    with pytest.raises(ValueError, match=r"^output_projection: expected 3 dims"):
        attn.contributions(q, k, v, output_projection=np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"^output_projection: expected shape \[1, 2, 4, E\]"):
        attn.contributions(q, k, v, output_projection=np.zeros((3, 4, 2), np.float32))
    with pytest.raises(ValueError, match=r"^v: expected"):
        attn.contributions(q, k, np.zeros((2, 6, 4), np.float32))
    with pytest.raises(TypeError, match="top_k"):
        attn.contributions(q, k, v, top_k=2)
