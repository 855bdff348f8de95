"""attn.scaled_dot_product_attention matches torch.nn.functional.scaled_dot_product_attention,
and torch tensors go in and come out (torch is in the test requirements; see also
test_sdpa_torch.py for PyTorch's edge cases)."""

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import attn  # noqa: E402

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16}
# (largest max abs difference from torch) per dtype: both round to the dtype at the end
LIMITS = {"float32": 2e-5, "float64": 1e-10, "float16": 4e-3, "bfloat16": 4e-2}


def _inputs(lead_q, lead_kv, len_q, len_k, dim, dim_v, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    def make(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    return (make(*lead_q, len_q, dim), make(*lead_kv, len_k, dim), make(*lead_kv, len_k, dim_v))


def _assert_matches_torch(got, want, dtype, rows_ok=None):
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
    got, want = got.double(), want.double()
    if rows_ok is not None:
        got, want = got[rows_ok], want[rows_ok]
    diff = (got - want).abs().max().item() if got.numel() else 0.0
    assert diff <= LIMITS[dtype], f"max abs difference {diff:.3g} (limit {LIMITS[dtype]:g})"


SHAPES = [((2, 3), (2, 3), 17, 17, 8, 8), ((1, 2), (1, 2), 3, 97, 5, 7), ((4,), (4,), 33, 5, 16, 16),
          ((2, 1, 2), (2, 1, 2), 5, 9, 4, 4)]


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_torch(shape, is_causal, dtype):
    q, k, v = _inputs(*shape, dtype)
    _assert_matches_torch(attn.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
                          F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mask_shape", ["full", "2d", "keys"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks_match_torch(kind, mask_shape, dtype):
    q, k, v = _inputs((2, 3), (2, 3), 7, 11, 8, 8, dtype)
    shape = {"full": (2, 3, 7, 11), "2d": (7, 11), "keys": (2, 1, 1, 11)}[mask_shape]
    g = torch.Generator().manual_seed(1)
    if kind == "bool":
        mask = torch.rand(*shape, generator=g) < 0.8
        mask[..., 0] = True  # no fully masked row here (see test_fully_masked_rows)
    else:
        mask = torch.randn(*shape, generator=g, dtype=TORCH_DTYPES[dtype])
    _assert_matches_torch(attn.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                          F.scaled_dot_product_attention(q, k, v, attn_mask=mask), dtype)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [((2, 4), (2, 2), 17, 33, 8, 8), ((6,), (1,), 9, 3, 4, 4)], ids=str)
def test_gqa_matches_torch(shape, is_causal):
    q, k, v = _inputs(*shape, "float32")
    _assert_matches_torch(
        attn.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True),
        F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True), "float32")


def test_scale_matches_torch():
    q, k, v = _inputs((2, 3), (2, 3), 5, 6, 8, 8, "float64")
    _assert_matches_torch(attn.scaled_dot_product_attention(q, k, v, scale=0.37),
                          F.scaled_dot_product_attention(q, k, v, scale=0.37), "float64")


def test_fully_masked_rows():
    """attn gives zeros for a row that sees no key; PyTorch gives NaN or zeros depending on
    version and backend. The other rows agree."""
    q, k, v = _inputs((1, 2), (1, 2), 4, 5, 8, 8, "float32")
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2] = False
    got = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (got[..., 2, :] == 0).all()
    assert torch.isnan(want[..., 2, :]).all() or (want[..., 2, :] == 0).all()
    rows_ok = torch.tensor([True, True, False, True])
    _assert_matches_torch(got[..., rows_ok, :], want[..., rows_ok, :], "float32")


def test_torch_in_torch_out_for_every_function():
    q = torch.randn(2, 3, 4)
    for result in (attn.attention(q, q, q), attn.scores(q, q), attn.softmax(q),
                   attn.context(attn.softmax(attn.scores(q, q)), q)):
        assert isinstance(result, torch.Tensor) and result.dtype == torch.float32
    out, lse, weights = attn.attention(q, q, q, return_lse=True, return_weights=True)
    assert isinstance(lse, torch.Tensor) and isinstance(weights, torch.Tensor)
    bf16 = q.to(torch.bfloat16)
    assert attn.attention(bf16, bf16, bf16).dtype == torch.bfloat16
    assert attn.softmax(bf16).dtype == torch.bfloat16


def test_torch_inputs_are_read_in_place():
    q = torch.randn(2, 5, 3, 8)
    seen = attn.describe_input(q, "bshd")
    assert seen["data"] == q.data_ptr() and seen["strides"] == (120, 8, 24, 1)
    bf16 = q.to(torch.bfloat16)
    assert attn.describe_input(bf16)["data"] == bf16.data_ptr()
    transposed = q.transpose(-1, -2)  # last dim not contiguous: copied
    assert attn.describe_input(transposed)["data"] != transposed.data_ptr()


def test_tensors_that_require_grad_under_no_grad_and_strided_tensors():
    q = torch.randn(2, 3, 6, 8, requires_grad=True)
    with torch.no_grad():
        _assert_matches_torch(attn.scaled_dot_product_attention(q, q, q),
                              F.scaled_dot_product_attention(q, q, q), "float32")
    t = torch.randn(2, 3, 8, 6).transpose(-1, -2)
    _assert_matches_torch(attn.scaled_dot_product_attention(t, t, t),
                          F.scaled_dot_product_attention(t, t, t), "float32")


def test_mixed_numpy_and_torch_follow_q():
    q = torch.randn(3, 4)
    out = attn.attention(q, q.numpy(), q.numpy())
    assert isinstance(out, torch.Tensor)
    assert isinstance(attn.attention(q.numpy(), q, q), np.ndarray)


def test_per_head_options_and_offsets_may_be_tensors():
    q = torch.randn(1, 2, 6, 4, dtype=torch.bfloat16)
    slopes, sinks = torch.tensor([0.5, 0.25], dtype=torch.bfloat16), torch.tensor([0.0, -1.0])
    offsets = torch.tensor([0, 2, 6], dtype=torch.int32)
    got = attn.attention(q, q, q, alibi_slopes=slopes, sinks=sinks, cu_seqlens_q=offsets,
                         cu_seqlens_k=offsets)
    want = attn.attention(q, q, q, alibi_slopes=[0.5, 0.25], sinks=[0.0, -1.0],
                          cu_seqlens_q=[0, 2, 6], cu_seqlens_k=[0, 2, 6])
    assert torch.equal(got, want)


def test_weights_return_torch_for_torch():
    q = torch.randn(2, 6, 8)
    weights, indices = attn.weights(q, q, top_k=3)
    assert isinstance(weights, torch.Tensor) and indices.dtype == torch.int64
    np.testing.assert_array_equal(attn.weights(q.numpy(), q.numpy()), attn.weights(q, q).numpy())


def test_decode_and_cache_give_torch_for_torch():
    cache = attn.KVCache(2, 8)
    seq = cache.add_sequence()
    k, v = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    cache.append(seq, k, v)
    assert torch.equal(cache.keys(seq), k) and torch.equal(cache.values(seq), v)
    q = torch.randn(1, 4, 8)
    out, lse = attn.decode(q, cache, [seq], return_lse=True)
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), attn.decode(q.numpy(), cache, [seq]))
    cache.append(seq, k[:, :1].numpy(), v[:, :1].numpy())
    assert isinstance(cache.keys(seq), np.ndarray)  # the kind appended last


def test_cache_storage_follows_the_data_or_the_callers_choice():
    """No dtype: the first append fixes the storage to the data's dtype, as a cache of
    torch tensors would; float32 keys are not rounded to float16 behind the caller's back,
    and float16 keys do not take float32's memory."""
    k = torch.tensor([[[1 + 2**-20, 1e-8, 70000.0, -3.3]]])
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        cache = attn.KVCache(1, 4)
        seq = cache.add_sequence()
        assert cache.dtype is None
        cache.append(seq, k.to(dtype), k.to(dtype))
        assert cache.dtype == str(dtype).removeprefix("torch.")
        assert torch.equal(cache.keys(seq), k.to(dtype).float())
    mixed = attn.KVCache(1, 4)
    mixed.append(mixed.add_sequence(), k.half(), k.bfloat16())  # float32 holds both exactly
    assert mixed.dtype == "float32" and torch.equal(mixed.values(0), k.bfloat16().float())
    half = attn.KVCache(1, 4, dtype="float16")  # the caller's choice: rounds, as asked
    half.append(half.add_sequence(), k, k)
    assert half.dtype == "float16" and not torch.equal(half.keys(0), k)


def test_a_cache_that_follows_the_data_refuses_what_it_would_round():
    cache = attn.KVCache(1, 4)
    seq = cache.add_sequence()
    cache.append(seq, torch.ones(1, 2, 4, dtype=torch.float16), torch.ones(1, 2, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"k: expected float16 .* given float32"):
        cache.append(seq, torch.ones(1, 1, 4), torch.ones(1, 1, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"v: expected float16 .* given bfloat16"):
        cache.append(seq, torch.ones(1, 1, 4, dtype=torch.float16), torch.ones(1, 1, 4, dtype=torch.bfloat16))
    assert cache.length(seq) == 2
    wide = attn.KVCache(1, 4)
    wide.append(wide.add_sequence(), torch.ones(1, 1, 4), torch.ones(1, 1, 4))
    wide.append(0, torch.ones(1, 1, 4, dtype=torch.bfloat16), torch.ones(1, 1, 4, dtype=torch.float16))
    assert wide.dtype == "float32" and wide.length(0) == 2


def test_gradients_attn_does_not_compute_are_refused_while_recorded(tmp_path):
    """A tensor that needs a gradient attn does not compute (slopes, the scale, the weights'
    mask, the lesson's steps, the cache and decoding) is refused, naming it, rather than
    given a detached result; under no_grad or inference_mode it is read. (attn.attention and
    scaled_dot_product_attention differentiate q, k, v, sinks and a float mask:
    test_backward.py, test_sdpa_torch.py.)"""
    x = torch.randn(2, 3, 4, requires_grad=True)
    p = torch.zeros(2, requires_grad=True)
    plain = torch.randn(2, 3, 4)
    cache = attn.KVCache(2, 4)
    cache.append(cache.add_sequence(), plain, plain)
    calls = [
        ("alibi_slopes", lambda: attn.attention(x, plain, plain, alibi_slopes=p)),
        ("mask", lambda: attn.weights(plain, plain, mask=torch.zeros(3, 3, requires_grad=True))),
        ("alibi_slopes", lambda: attn.weights(plain, plain, alibi_slopes=p)),
        ("k", lambda: attn.weights(plain, x)),
        ("scale", lambda: attn.weights(plain, plain, scale=torch.tensor(0.5, requires_grad=True))),
        ("q", lambda: attn.attention_state(x[None], plain[None], plain[None])),
        ("q", lambda: attn.decode(x[None, :, 0], cache, [0])),
        ("k", lambda: cache.append(0, x, plain)),
        ("v", lambda: cache.append([0], plain[None], x[None])),
        ("q", lambda: attn.scores(x, plain)),
        ("scores", lambda: attn.softmax(x)),
        ("weights", lambda: attn.context(x[..., :3], plain, check=False)),
    ]
    for name, call in calls:
        with pytest.raises(NotImplementedError, match=rf"^{name}: requires_grad=True .* no gradient for {name}"):
            call()
        with torch.no_grad():
            call()
        with torch.inference_mode():
            call()
    assert cache.length(0) == 3 + 2 * 2 * 3  # the refused appends stored nothing
    # A picture only reads the values: drawn, not refused.
    attn.viz.heatmap(torch.rand(3, 3, requires_grad=True), str(tmp_path / "w.svg"))
    assert (tmp_path / "w.svg").stat().st_size > 0


def test_threads_follow_torch_for_torch_inputs(monkeypatch):
    seen = []
    options = attn._request.options

    def recorded(*args, **kwargs):
        made = options(*args, **kwargs)
        seen.append(made.threads)
        return made

    monkeypatch.setattr(attn._request, "options", recorded)
    q = torch.randn(1, 2, 3, 4)
    cache = attn.KVCache(2, 4)
    cache.append(cache.add_sequence(), q[0], q[0])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        attn.scaled_dot_product_attention(q, q, q)
        attn.attention(q, q, q)
        attn.decode(q[:, :, 0], cache, [0])
        attn.attention(q, q, q, threads=2)
        attn.attention(q.numpy(), q.numpy(), q.numpy())
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1, 1, 2, 0]


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_a_cache_held_at_exit_leaks_nothing_nanobind_reports(kind):
    """nanobind prints "leaked instances" at interpreter exit for bound objects still alive
    when the module goes; a cache kept in a global, a cycle, the atexit list, a cache whose
    dtype follows the data (rebuilt at its first append), one never appended to, and one a
    daemon thread still holds at exit (which Python never frees) must not make it."""
    zeros = "torch.zeros" if kind == "torch" else "np.zeros"
    script = (
        f"import atexit, threading, time, numpy as np, attn{', torch' if kind == 'torch' else ''}\n"
        "cache = attn.KVCache(2, 4)\n"
        "seq = cache.add_sequence()\n"
        f"cache.append(seq, {zeros}((2, 3, 4)), {zeros}((2, 3, 4)))\n"
        f"cache.append([seq, cache.add_sequence()], {zeros}((2, 2, 1, 4)), {zeros}((2, 2, 1, 4)))\n"
        f"out = attn.decode({zeros}((1, 2, 4)), cache, [seq])\n"
        "empty = attn.KVCache(1, 8, dtype='int8'); empty.add_sequence()\n"
        "state = attn.decode_state(np.zeros((1, 2, 4)), cache, [seq])\n"
        "class Holder: pass\n"
        "holder = Holder(); holder.self = holder; holder.cache = cache\n"
        "atexit.register(lambda: cache.length(seq))\n"
        "def serve(held): time.sleep(600)\n"
        "threading.Thread(target=serve, args=(attn.KVCache(1, 4),), daemon=True).start()\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "leak" not in result.stderr, result.stderr
