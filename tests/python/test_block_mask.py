"""attn.BlockMask: its builders against their definitions, the kernels given one against
the same pattern as a dense mask (bit for bit, forward, weights and gradients), packed
sequences, the errors, and a packed batch of documents trained beside the same documents
one by one."""

import numpy as np
import pytest

import attn

L_Q, L_K = 300, 410


def definitions():
    """(name, BlockMask, the same pattern as a bool [B, H, Lq, Lk] array)."""
    i = np.arange(L_Q)[:, None]
    j = np.arange(L_K)[None, :]
    rng = np.random.default_rng(3)
    q_docs = np.sort(rng.integers(0, 7, L_Q))
    k_docs = np.sort(rng.integers(0, 7, L_K))
    prefixes = np.array([37, 150])
    yield ("documents", attn.BlockMask.documents(q_docs, k_docs, block_size=32),
           (q_docs[:, None] == k_docs[None, :])[None, None])
    yield ("prefix_lm", attn.BlockMask.prefix_lm(prefixes, L_Q, L_K, block_size=64),
           (j < prefixes[:, None, None, None]) | (j <= i))
    yield ("chunked", attn.BlockMask.chunked(50, L_Q, L_K, block_size=16),
           (i // 50 == j // 50)[None, None])
    yield ("window_global", attn.BlockMask.window_and_global(20, [0, 150], L_Q, L_K),
           ((np.abs(i - j) <= 20) | (i == 0) | (i == 150) | (j == 0) | (j == 150))[None, None])
    heads = rng.random((2, 3)) < 0.5

    def per_head(b, h, q, kv):
        chosen = heads[b[:, :, 0, 0], h[:, :, 0, 0]][:, :, None, None]
        return ((q * 7 + kv * 3 + h) % 5 != 0) & chosen | (kv < q // 3)

    b, h = np.arange(2)[:, None, None, None], np.arange(3)[None, :, None, None]
    yield ("predicate", attn.BlockMask.from_predicate(per_head, 2, 3, L_Q, L_K, block_size=32),
           per_head(b, h, i[None, None], j[None, None]))


DEFINITIONS = list(definitions())


@pytest.mark.parametrize("name,mask,dense", DEFINITIONS, ids=[d[0] for d in DEFINITIONS])
def test_each_builder_stores_its_pattern(name, mask, dense):
    got = mask.to_dense()
    assert got.shape == mask.shape
    assert np.array_equal(got, np.broadcast_to(dense, got.shape))
    assert mask.count("empty") + mask.count("full") + mask.count("partial") == (
        mask.shape[0] * mask.shape[1] * mask.blocks[0] * mask.blocks[1])
    again = attn.BlockMask.from_dense(got, block_size=mask.block_size)
    assert np.array_equal(again.to_dense(), got)
    assert again.count("partial") == mask.count("partial")
    # A kind and an int32 index per block, and 128 bits per row of each partial block.
    blocks = mask.shape[0] * mask.shape[1] * mask.blocks[0] * mask.blocks[1]
    words = -(-mask.block_size // 64)
    assert mask.nbytes == 5 * blocks + mask.count("partial") * mask.block_size * words * 8


def test_from_predicate_is_called_once_per_query_block_on_index_arrays():
    calls = []

    def causal(b, h, q, kv):
        calls.append((b.shape, h.shape, q.shape, kv.shape))
        return q >= kv

    mask = attn.BlockMask.from_predicate(causal, 2, 4, 300, 300, block_size=128)
    assert calls == [((2, 1, 1, 1), (1, 4, 1, 1), (1, 1, 128, 1), (1, 1, 1, 300))] * 2 + [
        ((2, 1, 1, 1), (1, 4, 1, 1), (1, 1, 44, 1), (1, 1, 1, 300))]
    assert mask.block(0, 0, 0, 1) == "empty" and mask.block(1, 3, 1, 0) == "full"
    assert mask.block(0, 2, 2, 2) == "partial"


def inputs(dtype, batch=2, heads=(6, 3), dim=48, seed=1):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, heads[0], L_Q, dim)).astype(dtype)
    k = rng.standard_normal((batch, heads[1], L_K, dim)).astype(dtype)
    v = rng.standard_normal((batch, heads[1], L_K, dim)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("name,mask,dense", DEFINITIONS, ids=[d[0] for d in DEFINITIONS])
@pytest.mark.parametrize("options", [{}, {"causal": True, "causal_align": "bottom-right"},
                                     {"softcap": 20.0, "sinks": [0.5, -1.0, 0.0] * 2}])
def test_kernels_give_the_dense_masks_bits(name, mask, dense, options):
    q, k, v = inputs(np.float32)
    if mask.shape[1] == 3:  # a mask per head: heads of the query
        q = q[:, :3]
        options = {**options, "sinks": options["sinks"][:3]} if "sinks" in options else options
    full = np.broadcast_to(dense, (2, q.shape[1], L_Q, L_K))
    out, lse, w = attn.attention(q, k, v, block_mask=mask, return_lse=True, return_weights=True,
                                 **options)
    out_d, lse_d, w_d = attn.attention(q, k, v, mask=full, return_lse=True, return_weights=True,
                                       **options)
    for got, want in ((out, out_d), (lse, lse_d), (w, w_d)):
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert np.array_equal(attn.weights(q, k, block_mask=mask, **options), w_d)
    dout = np.random.default_rng(2).standard_normal(out.shape).astype(np.float32)
    grads = attn.attention_backward(q, k, v, out, lse, dout, block_mask=mask, **options)
    grads_d = attn.attention_backward(q, k, v, out, lse, dout, mask=full, **options)
    for got, want in zip(grads, grads_d):
        assert np.array_equal(got, want)
    reference = attn.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                               block_mask=mask, backend="reference", **options)
    error = np.sum((out - reference) ** 2) / np.sum(reference ** 2)
    assert error < 1e-11


def test_autograd_through_a_block_mask_matches_the_dense_mask():
    torch = pytest.importorskip("torch")
    name, mask, dense = DEFINITIONS[0]
    q, k, v = (torch.tensor(x, requires_grad=True) for x in inputs(np.float32, batch=1))
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    attn.attention(q, k, v, block_mask=mask, causal=True).square().sum().backward()
    full = torch.tensor(np.broadcast_to(dense, (1, 6, L_Q, L_K)).copy())
    attn.attention(q2, k2, v2, mask=full, causal=True).square().sum().backward()
    for got, want in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        assert torch.equal(got, want)


def test_packed_sequences_read_their_own_entries():
    rng = np.random.default_rng(4)
    cu_q, cu_k = [0, 100, 180, 300], [0, 150, 260, 410]
    q = rng.standard_normal((1, 4, 300, 32)).astype(np.float32)
    k = rng.standard_normal((1, 2, 410, 32)).astype(np.float32)
    v = rng.standard_normal((1, 2, 410, 32)).astype(np.float32)
    prefixes = [20, 0, 60]
    mask = attn.BlockMask.prefix_lm(prefixes, 120, 150, block_size=16)
    packed = attn.attention(q, k, v, block_mask=mask, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    for s in range(3):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        alone_mask = mask.to_dense()[s:s + 1, :, :rows.stop - rows.start, :keys.stop - keys.start]
        alone = attn.attention(q[:, :, rows], k[:, :, keys], v[:, :, keys], mask=alone_mask)
        assert np.array_equal(packed[:, :, rows], alone)


def test_errors_name_the_argument():
    q, k, v = inputs(np.float32)
    with pytest.raises(attn.ArgumentTypeError, match="block_mask"):
        attn.attention(q, k, v, block_mask=np.ones((L_Q, L_K), bool))
    with pytest.raises(attn.Error, match="block_mask"):
        attn.attention(q, k, v, block_mask=attn.BlockMask.chunked(8, L_Q, L_K + 1))
    with pytest.raises(attn.Error, match="block_mask"):
        attn.attention(q, k, v, block_mask=attn.BlockMask.chunked(8, L_Q, L_K),
                       mask=np.ones((L_Q, L_K), bool))
    with pytest.raises(attn.Error, match="block_size"):
        attn.BlockMask.chunked(8, L_Q, L_K, block_size=100)
    with pytest.raises(attn.Error, match="len_q"):
        attn.BlockMask.chunked(8, 0, L_K)
    with pytest.raises(attn.Error, match="predicate"):
        attn.BlockMask.from_predicate(lambda b, h, i, j: i + j, 1, 1, 8, 8)
    with pytest.raises(attn.Error, match="predicate"):
        attn.BlockMask.from_predicate(lambda b, h, i, j: np.ones(3, bool), 1, 1, 8, 8)
    with pytest.raises(attn.ArgumentTypeError, match="query_documents"):
        attn.BlockMask.documents([0.5, 1.5])
    with pytest.raises(attn.Error, match="key_documents"):
        attn.BlockMask.documents([[0, 1]], [0, 1])
    cache = attn.KVCache(heads_kv=1, dim=8, dim_v=8)
    seq = cache.add_sequence()
    cache.append(seq, np.ones((1, 4, 8), np.float32), np.ones((1, 4, 8), np.float32))
    with pytest.raises(attn.ArgumentTypeError, match="block_mask"):
        attn.decode(np.ones((1, 1, 1, 8), np.float32), cache, [seq],
                    block_mask=attn.BlockMask.chunked(8, 1, 4))


def test_a_packed_batch_of_documents_trains_as_the_documents_one_by_one():
    """A tiny causal model trained on documents packed into one sequence with a document
    block mask, and on the same documents one at a time (gradients summed over them): the
    loss curves agree to float32 rounding."""
    torch = pytest.importorskip("torch")
    lengths = [37, 5, 64, 1, 90, 59]
    vocab, width, heads = 23, 32, 4
    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(vocab, (n + 1,), generator=generator) for n in lengths]
    ids = torch.tensor(np.repeat(np.arange(len(lengths)), lengths))
    mask = attn.BlockMask.documents(ids.numpy(), block_size=16)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = torch.nn.Embedding(vocab, width)
            self.positions = torch.nn.Embedding(max(lengths), width)
            self.qkv = torch.nn.Linear(width, 3 * width)
            self.head = torch.nn.Linear(width, vocab)

        def forward(self, x, positions, **options):
            h = self.tokens(x) + self.positions(positions)
            q, k, v = (t.view(1, -1, heads, width // heads).transpose(1, 2)
                       for t in self.qkv(h).split(width, dim=-1))
            out = attn.attention(q, k, v, causal=True, **options)
            return self.head(h + out.transpose(1, 2).reshape(1, -1, width))[0]

    def curve(packed):
        torch.manual_seed(1)
        model = Model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        tokens = sum(lengths)
        losses = []
        for _ in range(8):
            optimizer.zero_grad()
            if packed:
                x = torch.cat([d[:-1] for d in documents])[None]
                y = torch.cat([d[1:] for d in documents])
                positions = torch.cat([torch.arange(n) for n in lengths])[None]
                packed_loss = torch.nn.functional.cross_entropy(
                    model(x, positions, block_mask=mask), y)
                packed_loss.backward()
                loss = packed_loss.item()
            else:
                loss = 0.0
                for d in documents:
                    n = len(d) - 1
                    part = torch.nn.functional.cross_entropy(
                        model(d[None, :-1], torch.arange(n)[None]), d[1:], reduction="sum")
                    (part / tokens).backward()
                    loss += part.item() / tokens
            optimizer.step()
            losses.append(loss)
        return losses

    packed, alone = curve(True), curve(False)
    assert alone[-1] < 0.9 * alone[0]  # it learns
    for step, (a, b) in enumerate(zip(packed, alone), 1):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: packed {a}, one by one {b}"


def test_states_of_key_halves_merge_to_the_whole():
    """attention_state takes a block mask; the states of two halves of the keys, each with
    its half of the pattern, merge to the attention over all of them."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 300, 32)).astype(np.float32) for _ in range(3))
    mask = attn.BlockMask.documents(np.repeat(np.arange(6), 50), block_size=16)
    whole, lse = attn.attention(q, k, v, block_mask=mask, return_lse=True)
    out, state_lse = attn.finalize(attn.attention_state(q, k, v, block_mask=mask))
    assert np.array_equal(out, whole) and np.array_equal(state_lse, lse)
    dense = mask.to_dense()
    halves = [attn.attention_state(q, k[:, :, keys], v[:, :, keys],
                                   block_mask=attn.BlockMask.from_dense(dense[..., keys], 16))
              for keys in (slice(0, 150), slice(150, 300))]
    merged, merged_lse = attn.finalize(attn.merge(*halves))
    assert np.abs(merged - whole).max() < 1e-5 and np.abs(merged_lse - lse).max() < 1e-5
