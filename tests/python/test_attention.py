"""attn.attention against the float64 NumPy reference over the case list."""

import numpy as np
import pytest

import attn
import numpy_reference
from cases import assert_close, case_list, make_inputs, reference_output

CASES = case_list()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_attention_matches_reference(case):
    q, k, v, kwargs, ref_inputs = make_inputs(case)
    out, lse, weights = attn.attention(q, k, v, return_lse=True, return_weights=True, **kwargs)
    want_out, want_lse, want_weights = reference_output(case, ref_inputs)

    assert out.dtype == q.dtype
    stats = np.float64 if case.dtype == "float64" else np.float32
    assert lse.dtype == stats and weights.dtype == stats
    assert_close(out, want_out, case.dtype, "out")
    assert_close(lse, want_lse, case.dtype, "lse")
    assert_close(weights, want_weights, case.dtype, "weights")


@pytest.mark.parametrize("case", CASES[:16], ids=[c.name for c in CASES[:16]])
def test_out_alone_equals_out_with_extras(case):
    q, k, v, kwargs, _ = make_inputs(case)
    alone = attn.attention(q, k, v, **kwargs)
    with_lse, _ = attn.attention(q, k, v, return_lse=True, **kwargs)
    with_weights, _ = attn.attention(q, k, v, return_weights=True, **kwargs)
    np.testing.assert_array_equal(alone, with_lse)
    np.testing.assert_array_equal(alone, with_weights)


def test_returns_out_alone_or_a_tuple_in_order():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 5, 4))
    assert isinstance(attn.attention(q, q, q), np.ndarray)
    out, lse = attn.attention(q, q, q, return_lse=True)
    assert lse.shape == (2, 5)
    out, weights = attn.attention(q, q, q, return_weights=True)
    assert weights.shape == (2, 5, 5)
    assert len(attn.attention(q, q, q, return_lse=True, return_weights=True)) == 3


def test_bshd_output_is_contiguous_in_bshd():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 7, 3, 4)).astype(np.float32)  # [B, L, H, D]
    out = attn.attention(q, q, q, layout="bshd")
    assert out.shape == (2, 7, 3, 4) and out.flags.c_contiguous
    bhsd = attn.attention(*(x.transpose(0, 2, 1, 3) for x in (q, q, q)))
    np.testing.assert_array_equal(out, bhsd.transpose(0, 2, 1, 3))


def test_strided_views_read_in_place_give_the_same_result():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((2, 3, 20, 8)).astype(np.float32)
    q = base[:, :, ::2]  # every other query row: a strided, non-contiguous view
    k = base[:, :, 1::2]
    v = base[:, :, 1::2, :5]  # a narrower head dim, rows still contiguous
    got = attn.attention(q, k, v)
    want = attn.attention(*(np.ascontiguousarray(x) for x in (q, k, v)))
    np.testing.assert_array_equal(got, want)


def test_negative_strides_and_strided_last_dim_are_copied_not_misread():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 9, 6)).astype(np.float32)
    reversed_rows = q[:, ::-1]  # negative stride
    every_other = rng.standard_normal((2, 9, 12)).astype(np.float32)[..., ::2]  # stride 2 last dim
    want = attn.attention(np.ascontiguousarray(reversed_rows), q, np.ascontiguousarray(every_other))
    np.testing.assert_array_equal(attn.attention(reversed_rows, q, every_other), want)
    transposed = np.ascontiguousarray(q.transpose(0, 2, 1)).transpose(0, 2, 1)  # last dim stride 9
    np.testing.assert_array_equal(attn.attention(transposed, q, q), attn.attention(q, q, q))


def test_unaligned_input_is_copied():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 4)).astype(np.float32)
    raw = np.zeros(q.nbytes + 1, np.uint8)
    unaligned = np.frombuffer(raw.data, np.float32, count=q.size, offset=1).reshape(3, 4)
    assert not unaligned.flags.aligned
    unaligned[...] = q
    np.testing.assert_array_equal(attn.attention(unaligned, q, q), attn.attention(q, q, q))


def test_lists_are_accepted_as_float64():
    q = [[0.5, -1.0], [2.0, 0.25]]
    out = attn.attention(q, q, q)
    assert out.dtype == np.float64
    want, _, _ = numpy_reference.attention(*(np.array(q)[None, None],) * 3)
    assert_close(out, want[0, 0], "float64")


def test_mask_broadcasts_over_query_rows_like_numpy():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 5, 4))
    key_padding = np.array([[True, True, False, True, False], [True, False, True, True, True]])
    mask = key_padding[:, None, None, :]  # [B, 1, 1, Lk]
    got = attn.attention(q, q, q, mask=mask)
    full = np.broadcast_to(mask, (2, 3, 5, 5)).copy()
    np.testing.assert_array_equal(got, attn.attention(q, q, q, mask=full))


def test_threads_do_not_change_results(monkeypatch):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 33, 16)).astype(np.float32)
    one = attn.attention(q, q, q, causal=True, threads=1)
    np.testing.assert_array_equal(one, attn.attention(q, q, q, causal=True, threads=2))
    np.testing.assert_array_equal(one, attn.attention(q, q, q, causal=True))
    monkeypatch.setenv("ATTN_NUM_THREADS", "2")
    np.testing.assert_array_equal(one, attn.attention(q, q, q, causal=True))


def test_fully_masked_rows_give_zeros_and_minus_infinity():
    q = np.ones((1, 1, 3, 4), np.float32)
    mask = np.ones((3, 3), bool)
    mask[1] = False
    out, lse = attn.attention(q, q, q, mask=mask, return_lse=True)
    assert (out[0, 0, 1] == 0).all() and lse[0, 0, 1] == -np.inf
    assert np.isfinite(out).all()
