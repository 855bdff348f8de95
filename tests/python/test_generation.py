"""attn.State / merge / finalize / attention_state, attn.KVCache and attn.decode."""

import threading

import numpy as np
import pytest

import attn


def rng_arrays(seed, *shapes, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def nmse(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sum((got - want) ** 2) / np.sum(want ** 2))


def test_empty_state_finalizes_to_zeros_and_minus_infinity():
    empty = attn.State.empty(2, 3, 4, 5)
    out, lse = attn.finalize(empty)
    assert out.shape == (2, 3, 4, 5) and lse.shape == (2, 3, 4)
    assert np.all(out == 0) and np.all(lse == -np.inf)
    _, lse_sink = attn.finalize(empty, sinks=[0.5, -1.0, 2.0])
    np.testing.assert_array_equal(lse_sink[:, 0], 0.5)


def test_merge_with_empty_is_identity():
    q, k, v = rng_arrays(1, (1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 4), dtype=np.float32)
    s = attn.attention_state(q, k, v)
    merged = attn.merge(attn.State.empty(1, 2, 3, 4), s)
    for name in ("m", "l", "acc"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(s, name))


@pytest.mark.parametrize("cuts", [[1], [0, 7], [3, 10, 20]])
def test_merged_splits_equal_attention_over_all_keys(cuts):
    q, k, v = rng_arrays(2, (2, 4, 5, 16), (2, 2, 23, 16), (2, 2, 23, 8))
    sinks = [0.1, -0.3, 1.0, 0.0]
    state = attn.State.empty(2, 4, 5, 8, dtype="float64")
    bounds = [0] + cuts + [23]
    for a, b in zip(bounds[:-1], bounds[1:]):
        state = attn.merge(state, attn.attention_state(q, k[:, :, a:b], v[:, :, a:b], softcap=4.0))
    out, lse = attn.finalize(state, sinks=sinks)
    want, want_lse = attn.attention(q, k, v, softcap=4.0, sinks=sinks, return_lse=True)
    assert out.dtype == np.float64
    assert nmse(out, want) < 1e-26 and nmse(lse, want_lse) < 1e-26


def test_kv_cache_sizes_past_memory_raise_value_error_naming_the_argument():
    # heads_kv * page_size * dim * 2 bytes wraps in 64 bits: the append would write far
    # past a tiny block instead of failing.
    k = np.ones((1, 1, 8), np.float32)
    with pytest.raises(ValueError, match="page_size: expected a block of heads_kv \\* page_size"):
        cache = attn.KVCache(1, 8, page_size=2**60)
        cache.append(cache.add_sequence(), k, k)
    with pytest.raises(ValueError, match="page_size:"):
        attn.KVCache(2**40, 2**30, page_size=2**20)


def test_threads_on_different_sequences_of_one_cache():
    """Four threads append to four sequences (the pool grows under them) while a fifth
    decodes a finished one: every decode equals the first, every sequence holds what its
    thread appended."""
    cache = attn.KVCache(2, 16, page_size=2, dtype="float16")
    rng = np.random.default_rng(11)
    done_k, done_v = rng.standard_normal((2, 2, 50, 16)).astype(np.float32)
    finished = cache.add_sequence()
    cache.append(finished, done_k, done_v)
    q = rng.standard_normal((1, 4, 16)).astype(np.float32)
    first = attn.decode(q, cache, [finished])
    chunks = rng.standard_normal((4, 500, 2, 2, 3, 16)).astype(np.float32)
    seqs = [cache.add_sequence() for _ in range(4)]
    errors, decodes = [], []

    def append(w):
        try:
            for step in range(500):
                cache.append(seqs[w], chunks[w, step, 0], chunks[w, step, 1])
        except Exception as e:  # a failure in a thread must fail the test
            errors.append(e)

    writers = [threading.Thread(target=append, args=(w,)) for w in range(4)]

    def read():
        while True:  # at least once, and until every writer is done
            decodes.append(attn.decode(q, cache, [finished]))
            if not any(t.is_alive() for t in writers):
                break

    reader = threading.Thread(target=read)
    for t in writers:
        t.start()
    reader.start()
    for t in writers + [reader]:
        t.join()
    assert not errors
    assert decodes and all(np.array_equal(d, first) for d in decodes)
    for w, seq in enumerate(seqs):
        want_k = np.concatenate(list(chunks[w, :, 0]), axis=1).astype(np.float16).astype(np.float32)
        want_v = np.concatenate(list(chunks[w, :, 1]), axis=1).astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(cache.keys(seq), want_k)
        np.testing.assert_array_equal(cache.values(seq), want_v)


def test_kv_cache_bookkeeping_and_round_trip():
    cache = attn.KVCache(2, 3, page_size=4, dtype="float32")
    k, v = rng_arrays(3, (2, 10, 3), (2, 10, 3), dtype=np.float32)
    seq = cache.add_sequence()
    cache.append(seq, k, v)
    child = cache.fork(seq)
    assert cache.blocks_in_use == 3 and cache.block_table(child) == cache.block_table(seq)
    cache.append(child, k[:, :1], v[:, :1])  # copy-on-write of the shared partial block
    assert cache.blocks_in_use == 4 and cache.ref_count(cache.block_table(seq)[0]) == 2
    np.testing.assert_array_equal(cache.keys(seq), k)
    np.testing.assert_array_equal(cache.values(child)[:, :10], v)
    cache.drop(seq)
    assert seq not in cache and child in cache and cache.length(child) == 11
    assert cache.blocks_in_use == 3 and cache.blocks_free == 1


@pytest.mark.parametrize("dtype,bound", [("float32", 1e-12), ("float16", 1e-6), ("bfloat16", 1e-4),
                                         ("int8", 1e-3)])
@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_step_by_step_matches_causal_attention(dtype, bound, page_size):
    length, heads_q, heads_kv = 30, 4, 2
    q, k, v = rng_arrays(4, (heads_q, length, 16), (heads_kv, length, 16), (heads_kv, length, 8),
                         dtype=np.float32)
    cache = attn.KVCache(heads_kv, 16, 8, page_size=page_size, dtype=dtype)
    seq = cache.add_sequence()
    outs = []
    for t in range(length):
        cache.append(seq, k[:, t:t + 1], v[:, t:t + 1])
        outs.append(attn.decode(q[None, :, t], cache, [seq], alibi_slopes=[0.5, 0.25, 0.1, 0.0])[0])
    got = np.stack(outs, axis=1)
    want = attn.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                          causal=True, alibi_slopes=[0.5, 0.25, 0.1, 0.0])
    assert got.dtype == np.float32 and got.shape == want.shape
    assert nmse(got, want) < bound


def test_speculative_queries_see_keys_up_to_their_own_position():
    q, k, v = rng_arrays(5, (2, 3, 4, 8), (1, 40, 8), (1, 40, 8), dtype=np.float32)
    cache = attn.KVCache(1, 8, dtype="float32")
    ids = [cache.add_sequence(), cache.add_sequence()]
    cache.append(ids[0], k, v)
    cache.append(ids[1], k[:, :9], v[:, :9])
    out, lse = attn.decode(q, cache, ids, causal=True, return_lse=True)
    assert out.shape == (2, 3, 4, 8) and lse.shape == (2, 3, 4)
    for b, n in enumerate((40, 9)):
        want, want_lse = attn.attention(q[b].astype(np.float64), k[:, :n].astype(np.float64),
                                        v[:, :n].astype(np.float64), causal=True,
                                        causal_align="bottom-right", return_lse=True)
        assert nmse(out[b], want) < 1e-12 and nmse(lse[b], want_lse) < 1e-12


def test_decode_states_of_two_caches_merge_to_one_cache():
    q, k, v = rng_arrays(6, (1, 2, 8), (1, 50, 8), (1, 50, 8), dtype=np.float32)
    whole, head, tail = (attn.KVCache(1, 8, dtype="float32") for _ in range(3))
    ids = [c.add_sequence() for c in (whole, head, tail)]
    whole.append(ids[0], k, v)
    head.append(ids[1], k[:, :20], v[:, :20])
    tail.append(ids[2], k[:, 20:], v[:, 20:])
    merged = attn.merge(attn.decode_state(q, head, [ids[1]]), attn.decode_state(q, tail, [ids[2]]))
    out, _ = attn.finalize(merged, sinks=[0.2, -0.4])
    direct = attn.decode(q, whole, [ids[0]], sinks=[0.2, -0.4])
    assert nmse(out[:, :, 0], direct) < 1e-12


def test_forked_sequences_share_their_prompt_and_decode_alone_alike():
    q, k, v = rng_arrays(7, (3, 2, 16), (2, 100, 16), (2, 100, 16), dtype=np.float32)
    cache = attn.KVCache(2, 16, page_size=8, dtype="float16")
    parent = cache.add_sequence()
    cache.append(parent, k[:, :90], v[:, :90])
    children = [cache.fork(parent), cache.fork(parent)]
    cache.append(children[0], k[:, 90:], v[:, 90:])
    cache.append(children[1], k[:, 90:95], v[:, 90:95])
    ids = [parent] + children
    together = attn.decode(q, cache, ids)
    for i, seq in enumerate(ids):
        assert nmse(together[i], attn.decode(q[i:i + 1], cache, [seq])[0]) < 1e-12


def test_bad_input_raises_naming_the_argument():
    cache = attn.KVCache(2, 4, dtype="float32")
    seq = cache.add_sequence()
    cache.append(seq, np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="^dtype: expected one of"):
        attn.KVCache(2, 4, dtype="int4")
    with pytest.raises(ValueError, match="^heads_kv: expected a positive count"):
        attn.KVCache(0, 4)
    with pytest.raises(ValueError, match=r"^k: expected shape \[1, 2, n, 4\]"):
        cache.append(seq, np.zeros((2, 3, 5), np.float32), np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="^seq: expected the id of a sequence"):
        cache.append(seq + 7, np.zeros((2, 1, 4)), np.zeros((2, 1, 4)))
    with pytest.raises(ValueError, match=r"^q: expected shape \[1 \(one per seq_id\)"):
        attn.decode(np.zeros((1, 2, 5)), cache, [seq])
    with pytest.raises(ValueError, match="^seq_ids: expected ids of sequences in the cache"):
        attn.decode(np.zeros((1, 2, 4)), cache, [99])
    with pytest.raises(TypeError, match="^cache: expected an attn.KVCache"):
        attn.decode(np.zeros((1, 2, 4)), object(), [seq])
    with pytest.raises(TypeError, match="^seq_ids: expected a sequence of ids"):
        attn.decode(np.zeros((1, 2, 4)), cache, seq)
    with pytest.raises(TypeError, match="^b: expected an attn.State"):
        attn.merge(attn.State.empty(1, 1, 1, 1), None)
    with pytest.raises(ValueError, match=r"^b: expected acc of shape \[1, 1, 1, 1\]"):
        attn.merge(attn.State.empty(1, 1, 1, 1), attn.State.empty(1, 1, 1, 2))
