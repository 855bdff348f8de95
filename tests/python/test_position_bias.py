"""attn.PositionBias: its columns against transformers' own T5 bucket code, attention and the
table's gradient against T5's attention written with torch ops (the bias materialised), the
table's gradient by torch.autograd.gradcheck, attention_backward's outputs, packed sequences,
and the errors."""

import numpy as np
import pytest

import attn

torch = pytest.importorskip("torch")
modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")


@pytest.mark.parametrize("bidirectional,buckets,max_distance",
                         [(True, 32, 128), (True, 8, 20), (True, 33, 64), (False, 32, 128),
                          (False, 16, 40), (False, 5, 9)])
def test_t5_columns_are_transformers_buckets(bidirectional, buckets, max_distance):
    relative = torch.arange(-5000, 5001)  # key - query, as T5 writes it
    want = modeling_t5.T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=buckets, max_distance=max_distance)
    bias = attn.PositionBias(np.zeros(buckets, np.float32), "t5" if bidirectional else "t5_causal",
                             max_distance=max_distance)
    got = bias.columns_of(-relative.numpy())
    assert np.array_equal(got, want.numpy())


def test_clipped_columns_clamp():
    bias = attn.PositionBias(np.zeros(7, np.float32), offset=3)
    assert bias.columns_of([-10, -3, -2, 0, 3, 4, 99]).tolist() == [0, 0, 1, 3, 6, 6, 6]


def t5_inputs(is_decoder, len_q, len_k, dtype=torch.float32):
    """q, k, v [1, H, L, 8] and a T5 relative_attention_bias (nn.Embedding(32, H))."""
    torch.manual_seed(4)
    heads = 4
    config = modeling_t5.T5Config(d_model=32, d_kv=8, num_heads=heads, is_decoder=is_decoder,
                                  relative_attention_num_buckets=32,
                                  relative_attention_max_distance=128)
    layer = modeling_t5.T5Attention(config, has_relative_attention_bias=True).to(dtype)
    torch.nn.init.normal_(layer.relative_attention_bias.weight, std=1.0)
    q, k, v = (torch.randn(1, heads, n, 8, dtype=dtype) for n in (len_q, len_k, len_k))
    return layer, q, k, v


def t5_attention(layer, q, k, v, causal):
    """T5's attention in float64: softmax(q k^T + compute_bias) v, no scaling, with the
    decoder's causal mask (queries the last len_q positions of the keys)."""
    len_q, len_k = q.shape[2], k.shape[2]
    bias = layer.compute_bias(len_q, len_k, past_seen_tokens=len_k - len_q).double()
    scores = q.double() @ k.double().transpose(-1, -2) + bias
    if causal:
        keys = torch.arange(len_k)[None, :]
        places = torch.arange(len_q)[:, None] + len_k - len_q
        scores = scores.masked_fill(keys > places, float("-inf"))
    return torch.softmax(scores, -1) @ v.double()


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_attention_and_table_gradient_match_transformers(is_decoder):
    len_q, len_k = (70, 300) if is_decoder else (300, 300)
    layer, q, k, v = t5_inputs(is_decoder, len_q, len_k)
    weight = layer.relative_attention_bias.weight  # [buckets, heads]
    dout = torch.randn(1, 4, len_q, 8)

    want = t5_attention(layer, q, k, v, causal=is_decoder)
    (want * dout.double()).sum().backward()
    want_grad = weight.grad.clone()
    weight.grad = None

    bias = attn.PositionBias(weight.t(), "t5_causal" if is_decoder else "t5", max_distance=128)
    got = attn.attention(q, k, v, scale=1.0, causal=is_decoder, causal_align="bottom-right",
                         position_bias=bias, backend="fast")
    (got * dout).sum().backward()
    assert torch.allclose(got.double(), want, rtol=0, atol=2e-5)
    assert weight.grad.shape == want_grad.shape
    scale = want_grad.abs().max()
    assert scale > 1e-2
    assert torch.allclose(weight.grad.double(), want_grad.double(), rtol=0, atol=1e-4 * scale)


@pytest.mark.parametrize("buckets,causal", [("clipped", False), ("t5", True), ("t5_causal", True)])
def test_gradcheck_of_the_table(buckets, causal):
    torch.manual_seed(5)
    q = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 7, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 7, 2, dtype=torch.float64, requires_grad=True)
    columns = 9 if buckets == "clipped" else 8
    table = torch.randn(3, columns, dtype=torch.float64, requires_grad=True)

    def run(q, k, v, table):
        bias = attn.PositionBias(table, buckets, offset=4, max_distance=5)
        return attn.attention(q, k, v, causal=causal, softcap=3.0, position_bias=bias,
                              backend="reference")

    assert torch.autograd.gradcheck(run, (q, k, v, table))


def test_attention_backward_returns_the_table_gradient_last():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 40, 16)).astype(np.float32) for _ in range(3))
    table = rng.standard_normal((2, 11)).astype(np.float32)
    options = dict(position_bias=attn.PositionBias(table, offset=5), sinks=[0.5, -0.5])
    out, lse = attn.attention(q, k, v, return_lse=True, **options)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    grads = attn.attention_backward(q, k, v, out, lse, dout, **options)
    assert len(grads) == 5
    assert grads[3].shape == (2,) and grads[4].shape == table.shape
    assert grads[4].dtype == np.float32
    # Against the same bias as a float mask, whose gradient is dS summed by diagonal.
    distance = np.arange(40)[:, None] - np.arange(40)[None, :]
    dense = table[:, np.clip(distance + 5, 0, 10)]
    mask = torch.tensor(dense[None], requires_grad=True)
    tensors = [torch.tensor(x) for x in (q, k, v)]
    got = attn.attention(*tensors, mask=mask, sinks=[0.5, -0.5])
    assert np.allclose(got.detach().numpy(), out, atol=1e-6)
    (got * torch.tensor(dout)).sum().backward()
    dmask = mask.grad[0].double().numpy()
    want = np.zeros_like(table, dtype=np.float64)
    for column in range(11):
        want[:, column] = dmask[:, np.clip(distance + 5, 0, 10) == column].sum(-1)
    assert np.allclose(grads[4], want, atol=1e-4)


def test_packed_sequences_each_count_their_own_positions():
    rng = np.random.default_rng(7)
    lengths = [30, 1, 45]
    total = sum(lengths)
    q, k, v = (rng.standard_normal((2, total, 16)).astype(np.float32) for _ in range(3))
    bias = attn.PositionBias(rng.standard_normal((2, 16)).astype(np.float32), "t5_causal",
                             max_distance=30)
    cu = np.cumsum([0] + lengths)
    packed = attn.attention(q, k, v, causal=True, position_bias=bias, cu_seqlens_q=cu,
                            cu_seqlens_k=cu)
    for s in range(len(lengths)):
        rows = slice(cu[s], cu[s + 1])
        alone = attn.attention(q[:, rows], k[:, rows], v[:, rows], causal=True,
                               position_bias=bias)
        assert np.array_equal(packed[:, rows], alone)


def test_errors_name_the_argument():
    table = np.zeros((2, 8), np.float32)
    with pytest.raises(attn.Error, match="position_bias.buckets: expected 'clipped'"):
        attn.PositionBias(table, "alibi")
    with pytest.raises(attn.Error, match=r"position_bias.table: expected \[columns\]"):
        attn.PositionBias(np.zeros((1, 2, 8)))
    with pytest.raises(attn.Error, match="position_bias.max_distance"):
        attn.PositionBias(table, "t5", max_distance=2)
    q = np.zeros((3, 4, 8), np.float32)
    with pytest.raises(attn.Error, match="position_bias.table: expected 8 values"):
        attn.attention(q, q, q, position_bias=attn.PositionBias(table))
    with pytest.raises(attn.ArgumentTypeError, match="position_bias: expected an attn.Posit"):
        attn.attention(q, q, q, position_bias=table)
    cache = attn.KVCache(3, 8)
    seq = cache.add_sequence()
    with pytest.raises(attn.ArgumentTypeError, match="position_bias: not an option of decode"):
        attn.decode(q[None, :, :1], cache, [seq], position_bias=attn.PositionBias(table[0]))


def test_states_over_key_halves_merge_into_the_whole():
    """attention_state over each half of the keys (the second half placed by position_offset)
    merges into attention over all of them, and weights carry the bias too."""
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 50, 16)).astype(np.float32) for _ in range(3))
    bias = attn.PositionBias(rng.standard_normal((2, 32)), "t5", max_distance=20)
    first = attn.attention_state(q, k[:, :, :20], v[:, :, :20], position_bias=bias)
    second = attn.attention_state(q, k[:, :, 20:], v[:, :, 20:], position_bias=bias,
                                  position_offset=-20)
    out, lse = attn.finalize(attn.merge(first, second))
    want, want_lse = attn.attention(q, k, v, position_bias=bias, return_lse=True)
    assert np.allclose(out, want, atol=1e-5) and np.allclose(lse, want_lse, atol=1e-5)
    weights = attn.weights(q, k, position_bias=bias)
    assert np.allclose(attn.context(weights, v), want, atol=1e-5)
