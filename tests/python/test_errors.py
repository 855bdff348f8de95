"""Bad input raises ValueError or TypeError naming the argument, with what was expected and
what was given; nothing crashes the interpreter, whatever is passed."""

import numpy as np
import pytest

import attn

Q = np.zeros((2, 3, 4), np.float32)  # [H, L, D]
M = np.ones((3, 3), bool)


def attention(**changes):
    args = dict(q=Q, k=Q, v=Q)
    args.update(changes)
    return lambda: attn.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def sdpa(**changes):
    args = dict(query=Q, key=Q, value=Q)
    args.update(changes)
    return lambda: attn.scaled_dot_product_attention(**args)


# (name, call, exception, words the message must contain)
BAD_INPUTS = [
    ("q_none", attention(q=None), TypeError, ["q:", "None"]),
    ("k_object", attention(k=np.array([[1.0, "x"]], dtype=object)), TypeError, ["k:", "object"]),
    ("v_int", attention(v=np.zeros((2, 3, 4), np.int64)), TypeError, ["v:", "int64", "float32"]),
    ("q_complex", attention(q=Q.astype(np.complex64)), TypeError, ["q:", "complex64"]),
    ("q_string", attention(q="abc"), TypeError, ["q:", "str"]),
    ("q_ragged", attention(q=[[1.0], [1.0, 2.0]]), TypeError, ["q:"]),
    ("q_masked", attention(q=np.ma.masked_array(Q)), TypeError, ["q:", "masked array"]),
    ("sdpa_mask_list", sdpa(attn_mask=[[True, False]]), ValueError, ["attn_mask:", "given (1, 2)"]),
    ("window_numpy_int", attention(window=(np.int64(1), 1.0)), TypeError, ["window.right", "1.0"]),
    # Integers the extension cannot hold name the argument (not nanobind's signature list).
    ("window_past_64_bits", attention(window=(2**70, 0)), ValueError, ["window.left", str(2**70)]),
    ("threads_past_int", attention(threads=2**40), ValueError, ["threads:", "2147483647", str(2**40)]),
    ("kv_cache_dim_past_64_bits", lambda: attn.KVCache(1, 2**64), ValueError, ["dim:", str(2**64)]),
    ("cache_block_past_int", lambda: attn.KVCache(1, 2).ref_count(2**40), ValueError, ["block:", str(2**40)]),
    ("q_scalar", attention(q=np.float32(1)), ValueError, ["q:", "2, 3 or 4 dims", "0 dims"]),
    ("q_5d", attention(q=np.zeros((1, 1, 2, 3, 4), np.float32)), ValueError, ["q:", "5 dims"]),
    ("k_rank", attention(k=Q[0]), ValueError, ["k:", "3 dims (as q)", "(3, 4)"]),
    ("v_length", attention(v=Q[:, :2]), ValueError, ["v:", "given [1, 2, 2, 4]"]),
    ("k_dim", attention(k=np.zeros((2, 3, 5), np.float32)), ValueError, ["k:", "head dim", "[1, 2, 3, 5]"]),
    ("gqa_heads", attention(q=np.zeros((3, 3, 4), np.float32)), ValueError, ["k:", "dividing the 3 query heads"]),
    ("zero_dim", attention(q=np.zeros((2, 3, 0), np.float32), k=np.zeros((2, 3, 0), np.float32)), ValueError, ["q:", "head dim of at least 1"]),
    ("zero_heads", attention(q=np.zeros((0, 3, 4), np.float32)), ValueError, ["q:", "at least one head"]),
    ("layout", attention(layout="sbhd"), ValueError, ["layout:", "'sbhd'"]),
    ("causal_align", attention(causal_align="top"), ValueError, ["causal_align:", "'top'"]),
    ("causal_type", attention(causal="yes"), TypeError, ["causal:", "str"]),
    ("scale_nan", attention(scale=float("nan")), ValueError, ["scale:", "finite", "nan"]),
    ("scale_type", attention(scale="1"), TypeError, ["scale:", "str"]),
    ("window_type", attention(window=3), TypeError, ["window:", "3"]),
    ("window_float", attention(window=(1.5, 0)), TypeError, ["window.left", "1.5"]),
    ("window_value", attention(window=(-2, 0)), ValueError, ["window.left", "-2"]),
    ("softcap", attention(softcap=-1.0), ValueError, ["softcap:", ">= 0", "-1"]),
    ("alibi_length", attention(alibi_slopes=[0.5]), ValueError, ["alibi_slopes:", "2 values", "given 1"]),
    ("alibi_2d", attention(alibi_slopes=[[0.5, 0.5]]), ValueError, ["alibi_slopes:", "1-D"]),
    ("sinks_nan", attention(sinks=[0.0, float("nan")]), ValueError, ["sinks:", "finite"]),
    ("sinks_ragged", attention(sinks=[[0.0], [1.0, 2.0]]), TypeError, ["sinks:", "1-D sequence"]),
    ("sinks_text", attention(sinks=["a", "b"]), TypeError, ["sinks:", "numbers"]),
    ("cu_one", attention(cu_seqlens_q=[0, 3]), ValueError, ["cu_seqlens_k:", "both"]),
    ("cu_float", attention(cu_seqlens_q=[0.0, 3.0], cu_seqlens_k=[0, 3]), TypeError, ["cu_seqlens_q:", "integers"]),
    ("cu_last", attention(cu_seqlens_q=[0, 2], cu_seqlens_k=[0, 3]), ValueError, ["cu_seqlens_q:", "packed length 3", "[0, 2]"]),
    ("cu_order", attention(cu_seqlens_q=[0, 2, 1, 3], cu_seqlens_k=[0, 1, 2, 3]), ValueError, ["cu_seqlens_q:", "non-decreasing"]),
    ("cu_batched", attention(q=np.zeros((2, 2, 3, 4)), k=np.zeros((2, 2, 3, 4)), v=np.zeros((2, 2, 3, 4)),
                             cu_seqlens_q=[0, 3], cu_seqlens_k=[0, 3]), ValueError, ["q:", "batch 1"]),
    ("mask_shape", attention(mask=np.ones((3, 2), bool)), ValueError, ["mask:", "broadcastable to [1, 2, 3, 3]", "(1, 1, 3, 2)"]),
    ("mask_rank", attention(mask=np.ones(3, bool)), ValueError, ["mask:", "2 to 4 dims"]),
    ("mask_int", attention(mask=np.ones((3, 3), np.int32)), TypeError, ["mask:", "int32", "bool"]),
    ("mask_packed", attention(mask=M, cu_seqlens_q=[0, 3], cu_seqlens_k=[0, 3]), ValueError, ["mask:", "packed"]),
    ("threads_zero", attention(threads=0), ValueError, ["threads:", "positive", "0"]),
    ("threads_type", attention(threads="2"), TypeError, ["threads:", "'2'"]),
    ("return_type", attention(return_lse=1), TypeError, ["return_lse:", "int"]),
    ("sdpa_query_1d", sdpa(query=np.zeros(4, np.float32)), ValueError, ["query:", "at least 2 dims"]),
    ("sdpa_value_heads", sdpa(value=np.zeros((3, 3, 4), np.float32)), ValueError,
     ["query, key, value:", "broadcast", "value (3,)"]),
    ("sdpa_value_length", sdpa(value=Q[:, :2]), ValueError, ["value:", "length S of key", "(2, 2, 4)"]),
    ("sdpa_dropout_type", sdpa(dropout_p="0"), TypeError, ["dropout_p:", "str"]),
    ("sdpa_mask_shape", sdpa(attn_mask=np.ones((4, 3), bool)), ValueError, ["attn_mask:", "broadcastable"]),
    ("sdpa_mask_batch", sdpa(query=np.zeros((2, 1, 3, 4)), key=np.zeros((2, 1, 3, 4)), value=np.zeros((2, 1, 3, 4)),
                             attn_mask=np.ones((3, 1, 3, 3), bool)), ValueError, ["attn_mask:", "broadcastable"]),
    ("sdpa_mask_rank", sdpa(attn_mask=np.ones((1, 1, 3, 3), bool)), ValueError, ["attn_mask:", "broadcastable"]),
    ("sdpa_gqa_batch", sdpa(query=np.zeros((2, 4, 3, 4)), key=np.zeros((3, 2, 3, 4)), value=np.zeros((3, 2, 3, 4)),
                            enable_gqa=True), ValueError, ["batch dims", "query (2,), key (3,)"]),
    ("scores_kind", lambda: attn.scores(Q, Q, kind="cosine"), ValueError, ["kind:", "'cosine'"]),
    ("scores_weight_missing", lambda: attn.scores(Q, Q, kind="general"), ValueError, ["weight:", "(4, 4)", "None"]),
    ("scores_weight_shape", lambda: attn.scores(Q, Q, kind="general", weight=np.eye(3)), ValueError, ["weight:", "(4, 4)", "(3, 3)"]),
    ("scores_weight_unused", lambda: attn.scores(Q, Q, weight=np.eye(4)), ValueError, ["weight:", "None"]),
    ("scores_scale_unused", lambda: attn.scores(Q, Q, kind="dot", scale=2.0), ValueError, ["scale:", "None"]),
    ("scores_energy_missing", lambda: attn.scores(Q, Q, kind="additive", query_projection=np.eye(4), key_projection=np.eye(4)),
     ValueError, ["energy:", "None"]),
    ("scores_projection_shape", lambda: attn.scores(Q, Q, kind="additive", query_projection=np.eye(4), key_projection=np.eye(3),
                                                    energy=np.ones(4)), ValueError, ["key_projection:", "(4, 4)", "(3, 3)"]),
    ("scores_dims", lambda: attn.scores(Q, np.zeros((2, 3, 5), np.float32)), ValueError, ["k:", "head dim 4"]),
    ("scores_rank", lambda: attn.scores(Q, Q[0]), ValueError, ["k:", "3 dims (as q)"]),
    ("softmax_nan", lambda: attn.softmax(np.array([0.0, np.nan])), ValueError, ["scores:", "finite values or -inf", "nan"]),
    ("softmax_5d", lambda: attn.softmax(np.zeros((1, 1, 1, 1, 2))), ValueError, ["scores:", "5 dims"]),
    ("softmax_none", lambda: attn.softmax(None), TypeError, ["scores:", "None"]),
    ("context_keys", lambda: attn.context(np.ones((2, 3)) / 3, np.ones((4, 2))), ValueError, ["v:", "key count"]),
    ("context_tolerance", lambda: attn.context(np.ones((2, 3)) / 3, np.ones((3, 2)), tolerance=-1.0), ValueError, ["tolerance:", ">= 0"]),
    ("context_check_type", lambda: attn.context(np.ones((2, 3)) / 3, np.ones((3, 2)), check=None), TypeError, ["check:"]),
]


@pytest.mark.parametrize("name, call, error, words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_names_the_argument(name, call, error, words):
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_unknown_backend_in_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("ATTN_BACKEND", "bogus")
    with pytest.raises(ValueError, match="ATTN_BACKEND: expected 'reference' or unset"):
        attn.attention(Q, Q, Q)


def test_zero_length_sequences_give_empty_or_zero_outputs():
    empty_q = np.zeros((2, 0, 4), np.float32)
    assert attn.attention(empty_q, Q, Q).shape == (2, 0, 4)
    no_keys = np.zeros((2, 0, 4), np.float32)
    out, lse = attn.attention(Q, no_keys, no_keys, return_lse=True)
    assert (out == 0).all() and (lse == -np.inf).all()
    assert attn.attention(np.zeros((0, 2, 3, 4)), np.zeros((0, 2, 3, 4)), np.zeros((0, 2, 3, 4))).shape == (0, 2, 3, 4)
    assert attn.softmax(np.zeros((3, 0))).shape == (3, 0)


JUNK = [None, 0, 1.5, "q", b"q", [], [[]], [1, 2], {}, object(), np.array(None), np.zeros(3, object),
        np.zeros((2, 2), np.int8), np.zeros((2, 2), np.uint16), np.zeros((2, 2), "U1"),
        np.zeros((2, 2), [("a", np.float32)]), np.zeros((0, 0, 0, 0)), np.zeros((1, 1, 1, 1, 1)),
        np.zeros((2, 2, 2))[..., ::-1], np.zeros((4, 4))[::2, ::2], np.float64(np.nan)]


@pytest.mark.parametrize("position", range(3))
@pytest.mark.parametrize("junk", JUNK, ids=lambda j: type(j).__name__ + str(getattr(j, "shape", "")))
def test_junk_in_any_position_raises_cleanly(junk, position):
    """Each call either computes (a reversed array is copied and read) or raises TypeError
    or ValueError; any other exception fails the test, and a crash fails the run."""
    for function in (attn.attention, attn.scaled_dot_product_attention, attn.scores, attn.context):
        args = [np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2))][: 3 if function in (attn.attention, attn.scaled_dot_product_attention) else 2]
        if position >= len(args):
            continue
        args[position] = junk
        try:
            function(*args)
        except (TypeError, ValueError):
            pass
    try:
        attn.softmax(junk)
    except (TypeError, ValueError):
        pass
