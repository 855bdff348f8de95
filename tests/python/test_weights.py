"""attn.weights against the float64 NumPy reference: every weight over the case list,
selections as slices of the full matrix, top-k as a sort of the reference weights."""

import numpy as np
import pytest

import attn
from cases import Case, assert_close, case_list, make_inputs, narrow_row_cases, reference_output

CASES = case_list()
BITWISE_CASES = CASES + narrow_row_cases()


@pytest.mark.parametrize("case", BITWISE_CASES, ids=[c.name for c in BITWISE_CASES])
def test_weights_are_the_weights_attention_returns_bit_for_bit(case):
    """attn.weights sums each row's lse by the walk attn.attention's kernel runs, and scores
    each chunk by the same kernel: the same bits, not merely close ones."""
    q, k, v, kwargs, _ = make_inputs(case)
    alone = attn.weights(q, k, **kwargs)
    _, returned = attn.attention(q, k, v, return_weights=True, **kwargs)
    assert alone.dtype == returned.dtype and alone.shape == returned.shape
    assert np.array_equal(alone.view(np.uint8), returned.view(np.uint8))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_weights_match_reference(case):
    q, k, _, kwargs, ref_inputs = make_inputs(case)
    got = attn.weights(q, k, **kwargs)
    _, want_lse, want = reference_output(case, ref_inputs)
    assert got.dtype == (np.float64 if case.dtype == "float64" else np.float32)
    assert_close(got, want, case.dtype, "weights")
    # Rows sum to 1 less the sinks' share; rows that see nothing are zero.
    sums = got.astype(np.float64).sum(axis=-1)
    seen = np.isfinite(want_lse)
    assert (got[~seen] == 0).all()
    share = np.zeros(sums.shape)
    if "sinks" in kwargs:
        sinks = np.asarray(kwargs["sinks"], np.float64)
        sinks = {4: sinks[None, :, None], 3: sinks[:, None], 2: sinks[0]}[case.rank]
        share = np.exp(sinks - np.where(seen, want_lse, 0.0))
    tolerance = 1e-12 if case.dtype == "float64" else 1e-6
    np.testing.assert_allclose(sums[seen], (1.0 - share)[seen], rtol=0, atol=tolerance)


def _selection_case():
    return Case(batch=2, heads_q=4, heads_kv=2, len_q=70, len_k=150, dim=16, dim_v=16,
                causal=True, bottom_right=True, sinks=True, mask="float")


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_heads_and_rows_are_slices_of_the_full_matrix(layout):
    case = _selection_case()
    q, k, _, kwargs, _ = make_inputs(case)
    if layout == "bshd":
        q, k = (x.transpose(0, 2, 1, 3).copy() for x in (q, k))
        kwargs["layout"] = "bshd"
    full = attn.weights(q, k, **kwargs)
    heads, rows = [3, 0, 3], [69, 0, 35, 1, 35]
    part = attn.weights(q, k, heads=heads, rows=rows, **kwargs)
    assert part.shape == (2, 3, 5, 150)
    np.testing.assert_array_equal(part, full[:, heads][:, :, rows])
    np.testing.assert_array_equal(attn.weights(q, k, heads=np.array([2]), **kwargs), full[:, [2]])
    np.testing.assert_array_equal(attn.weights(q, k, rows=[7], **kwargs), full[:, :, [7]])


def _expected_top_k(want, k):
    """The reference's keys per row by descending weight, ties by lower index; a k above
    Lk is taken as Lk."""
    order = np.argsort(-want, axis=-1, kind="stable")[..., :k]
    weights = np.take_along_axis(want, order, axis=-1)
    order = np.where(weights > 0, order, -1)
    return np.where(weights > 0, weights, 0.0), order


@pytest.mark.parametrize("case", [
    _selection_case(),
    Case(heads_q=2, heads_kv=1, len_q=40, len_k=300, dim=24, dim_v=24, window=(50, 10),
         dtype="bfloat16"),
    Case(heads_q=3, heads_kv=3, len_q=30, len_k=90, dim=8, dim_v=8, packed=True, causal=True),
    Case(heads_q=1, heads_kv=1, len_q=9, len_k=20, dim=4, dim_v=4, rank=2, dtype="float64"),
], ids=lambda c: c.name)
@pytest.mark.parametrize("k", [1, 8, 200])
def test_top_k_matches_sorted_reference(case, k):
    q, key, _, kwargs, ref_inputs = make_inputs(case)
    weights, indices = attn.weights(q, key, top_k=k, **kwargs)
    _, _, want = reference_output(case, ref_inputs)
    want_weights, want_indices = _expected_top_k(want, k)
    assert indices.dtype == np.int64 and indices.shape == want_indices.shape
    assert_close(weights, want_weights, case.dtype, "top-k weights")
    # Keys agree wherever the reference's neighbours are not tied within float32 error.
    gaps = np.abs(np.diff(want_weights, axis=-1))
    tied = np.zeros(want_weights.shape, bool)
    tied[..., 1:] |= gaps < 1e-5
    tied[..., :-1] |= gaps < 1e-5
    np.testing.assert_array_equal(indices[~tied], want_indices[~tied])
    np.testing.assert_array_equal(indices == -1, want_indices == -1)
    # The weights are those of the full matrix at the chosen keys.
    full = attn.weights(q, key, **kwargs)
    picked = np.take_along_axis(full, np.maximum(indices, 0), axis=-1)
    np.testing.assert_array_equal(np.where(indices >= 0, picked, 0), weights)


def test_top_k_ties_go_to_the_lower_key_index():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 5, 8)).astype(np.float32)
    base = rng.standard_normal((2, 4, 8)).astype(np.float32)
    k = np.tile(base, (1, 30, 1))  # key j is a copy of key j % 4
    _, indices = attn.weights(q, k, top_k=60)
    full = attn.weights(q, k)
    for h in range(2):
        for row in range(5):
            order = sorted(range(120), key=lambda j: (-full[h, row, j % 4], j))
            assert indices[h, row].tolist() == order[:60]


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(heads=[4]), ValueError, "heads: expected query heads in [0, 4), given 4 at position 0"),
    (dict(heads=[-1]), ValueError, "heads: expected query heads in [0, 4)"),
    (dict(heads=[0.5]), TypeError, "heads: expected a sequence of ints"),
    (dict(rows=[0, 9]), ValueError, "rows: expected query rows in [0, 9), given 9 at position 1"),
    (dict(rows=[]), ValueError, "rows: expected a non-empty 1-D sequence"),
    (dict(top_k=0), ValueError, "top_k: expected None or an int >= 1, given 0"),
    (dict(top_k=2.0), TypeError, "top_k: expected None or an int >= 1"),
    (dict(causal_align="middle"), ValueError, "causal_align: expected"),
    (dict(sinks=[1.0]), ValueError, "sinks: expected 4 values"),
])
def test_bad_arguments_name_themselves(kwargs, error, text):
    q = np.zeros((1, 4, 9, 8), np.float32)
    k = np.zeros((1, 2, 11, 8), np.float32)
    with pytest.raises(error) as raised:
        attn.weights(q, k, **kwargs)
    assert text in str(raised.value)


def test_top_k_above_lk_is_capped_and_rows_seeing_fewer_keys_pad_with_minus_one():
    q = np.ones((3, 4), np.float32)
    weights, indices = attn.weights(q, q, top_k=6, causal=True)
    assert weights.shape == indices.shape == (3, 3)
    assert indices.tolist()[0] == [0, -1, -1]
    assert indices.tolist()[2] == [0, 1, 2]
    np.testing.assert_allclose(weights[2], [1 / 3] * 3, rtol=1e-6)
    assert (weights[0, 1:] == 0).all()
