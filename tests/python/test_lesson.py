"""The lesson's three steps (attn.scores, attn.softmax, attn.context) against the float64
NumPy reference, and their composition against attn.attention."""

import numpy as np
import pytest

import attn
import numpy_reference
from cases import assert_close, random_array

# (q shape, k shape): every rank, awkward sizes, GQA.
SHAPES = [((5, 4), (3, 4)), ((2, 17, 8), (2, 97, 8)), ((2, 4, 3, 5), (2, 2, 17, 5)),
          ((1, 1, 1, 1), (1, 1, 1, 1)), ((3, 1, 6), (1, 17, 6))]
DTYPES = ["float16", "bfloat16", "float32", "float64"]


def _params(rng, kind, dim_q, dim_k, hidden=3):
    if kind == "general":
        return dict(weight=rng.standard_normal((dim_q, dim_k)))
    if kind == "additive":
        return dict(query_projection=rng.standard_normal((hidden, dim_q)),
                    key_projection=rng.standard_normal((hidden, dim_k)),
                    energy=rng.standard_normal(hidden))
    if kind == "scaled_dot":
        return dict(scale=0.7)
    return {}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["dot", "scaled_dot", "general", "additive"])
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"q{s[0]}_k{s[1]}")
def test_scores_match_reference(shapes, kind, dtype):
    rng = np.random.default_rng(5)
    q = random_array(rng, shapes[0], dtype)
    k = random_array(rng, shapes[1], dtype)
    params = _params(rng, kind, q.shape[-1], k.shape[-1])
    got = attn.scores(q, k, kind=kind, **params)
    assert got.dtype == q.dtype and got.shape == q.shape[:-1] + (k.shape[-2],)
    assert_close(got, numpy_reference.scores(q, k, kind=kind, **params), dtype)


def test_scaled_dot_default_scale_is_inverse_sqrt_dim():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((4, 9)), rng.standard_normal((6, 9))
    np.testing.assert_allclose(attn.scores(q, k), attn.scores(q, k, kind="dot") / 3.0, rtol=1e-14)


def test_general_score_with_unequal_dims():
    rng = np.random.default_rng(0)
    q, k, w = rng.standard_normal((4, 3)), rng.standard_normal((6, 5)), rng.standard_normal((3, 5))
    assert_close(attn.scores(q, k, kind="general", weight=w), q @ w @ k.T, "float64")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7,), (3, 17), (2, 5, 97), (2, 3, 4, 1), (1, 1, 1, 1)], ids=str)
def test_softmax_matches_reference(shape, dtype):
    rng = np.random.default_rng(6)
    s = random_array(rng, shape, dtype) * 4
    got = attn.softmax(s)
    assert got.dtype == s.dtype and got.shape == s.shape
    assert_close(got, numpy_reference.softmax(s), dtype)


def test_softmax_hides_minus_infinity_and_zeroes_masked_rows():
    s = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    got = attn.softmax(s)
    assert got[0, 1] == 0.0 and abs(got[0].sum() - 1) < 1e-15
    assert (got[1] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", [((5, 3), (3, 4)), ((4, 17, 97), (2, 97, 3)),
                                    ((2, 2, 1, 1), (2, 1, 1, 5))], ids=lambda s: f"w{s[0]}_v{s[1]}")
def test_context_matches_reference(shapes, dtype):
    rng = np.random.default_rng(7)
    weights = numpy_reference.softmax(rng.standard_normal(shapes[0])).astype(np.float32)
    v = random_array(rng, shapes[1], dtype)
    got = attn.context(weights, v, tolerance=1e-4)
    assert got.dtype == v.dtype and got.shape == shapes[0][:-1] + (shapes[1][-1],)
    assert_close(got, numpy_reference.context(weights, v), dtype)


def test_context_checks_weights_unless_told_not_to():
    weights = np.array([[0.5, 0.6]])
    v = np.ones((2, 3))
    with pytest.raises(ValueError, match="alpha: expected rows summing to 1"):
        attn.context(weights, v)
    np.testing.assert_allclose(attn.context(weights, v, check=False), [[1.1, 1.1, 1.1]])
    np.testing.assert_allclose(attn.context(weights, v, tolerance=0.2), [[1.1, 1.1, 1.1]])
    with pytest.raises(ValueError, match="finite, non-negative"):
        attn.context(np.array([[1.5, -0.5]]), v)


def test_three_steps_equal_attention():
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((2, 3, 9, 4)), rng.standard_normal((2, 1, 11, 4)), rng.standard_normal((2, 1, 11, 6))
    steps = attn.context(attn.softmax(attn.scores(q, k)), v)
    assert_close(steps, attn.attention(q, k, v), "float64")
