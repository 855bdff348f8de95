"""attn.State / merge / finalize / attention_state, attn.KVCache and attn.decode."""

import threading

import numpy as np
import pytest

import attn
import numpy_reference


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
                                         ("int8", 1e-3), ("fp8_e4m3", 3e-3),
                                         ("fp8_e5m2", 1e-2)])
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
        attn.KVCache(2, 4, dtype="int2")
    with pytest.raises(ValueError, match="^dim: expected a multiple of 32 for int4"):
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


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "fp8_e4m3", None])
def test_a_batched_append_stores_what_appends_one_by_one_store(dtype):
    """cache.append(ids, k, v) with k: [S, Hkv, n, D] is S single appends: the same
    tokens, blocks, copy-on-write of forked prompts and int8 scales, bit for bit."""
    k, v = rng_arrays(11, (4, 2, 3, 8), (4, 2, 3, 5), dtype=np.float32)
    prompt_k, prompt_v = rng_arrays(12, (2, 6, 8), (2, 6, 5), dtype=np.float32)
    caches = [attn.KVCache(2, 8, 5, page_size=4, dtype=dtype) for _ in range(2)]
    for cache in caches:
        root = cache.add_sequence()
        cache.append(root, prompt_k, prompt_v)
        ids = [cache.fork(root), cache.add_sequence(), root, cache.fork(root)]
    batched, single = caches
    for step in range(3):  # a decode loop: one token per sequence and step
        batched.append(ids, k[:, :, step:step + 1], v[:, :, step:step + 1])
        for s, seq in enumerate(ids):
            single.append(seq, k[s, :, step:step + 1], v[s, :, step:step + 1])
    batched.append(ids[::-1], k[::-1], v[::-1])  # any order, n tokens each
    for s, seq in enumerate(ids):
        single.append(seq, k[s], v[s])
    for seq in ids:
        np.testing.assert_array_equal(batched.keys(seq), single.keys(seq))
        np.testing.assert_array_equal(batched.values(seq), single.values(seq))
        assert batched.block_table(seq) == single.block_table(seq)
    assert batched.dtype == single.dtype == (dtype or "float32")
    q = rng_arrays(13, (4, 4, 8), dtype=np.float32)[0]
    np.testing.assert_array_equal(attn.decode(q, batched, ids), attn.decode(q, single, ids))
    batched.append([], np.zeros((0, 2, 1, 8)), np.zeros((0, 2, 1, 5)))  # no sequences: nothing


def test_a_batched_append_refuses_bad_input_naming_the_argument():
    cache = attn.KVCache(2, 4, dtype="float32", page_size=2, max_blocks=3)
    a, b = cache.add_sequence(), cache.add_sequence()
    k = np.zeros((2, 2, 1, 4), np.float32)
    with pytest.raises(ValueError, match=r"^seq: expected distinct sequence ids, given 0 2 times"):
        cache.append([a, b, a], np.zeros((3, 2, 1, 4)), np.zeros((3, 2, 1, 4)))
    with pytest.raises(ValueError, match=r"^seq: expected ids of sequences in the cache, given 9 at position 1"):
        cache.append([a, 9], k, k)
    with pytest.raises(TypeError, match=r"^seq: expected sequence ids \(ints\)"):
        cache.append([a, "b"], k, k)
    with pytest.raises(ValueError, match=r"^k: expected 4 dims \[3, heads_kv, n, dim\]"):
        cache.append([a, b, cache.add_sequence()], k, k)
    with pytest.raises(ValueError, match=r"^v: expected 4 dims \[2, heads_kv, n, dim\]"):
        cache.append([a, b], k, k[0])
    with pytest.raises(ValueError, match=r"^v: expected n = 1 tokens \(as k\)"):
        cache.append([a, b], k, np.zeros((2, 2, 3, 4)))
    with pytest.raises(ValueError, match=r"^k: expected shape \[1, 2, n, 4\]"):
        cache.append([a, b], np.zeros((2, 3, 1, 4)), np.zeros((2, 3, 1, 4)))
    assert cache.length(a) == cache.length(b) == 0  # nothing of a refused batch was stored
    # The pool (3 blocks of 2 tokens) runs out at the second sequence: the first keeps its
    # tokens, and the error says which id was not appended.
    with pytest.raises(ValueError, match=r"^seq\[1\]: .*max_blocks.*seq\[0:1\] were appended"):
        cache.append([a, b], np.zeros((2, 2, 4, 4)), np.zeros((2, 2, 4, 4)))
    assert cache.length(a) == 4 and cache.length(b) == 0


def test_a_cache_dtype_follows_the_first_append_and_keeps_the_sequence_ids():
    """dtype=None: sequences added, forked and dropped before the first append keep their
    ids when the storage is chosen; float64 data is stored as float32, attn's precision."""
    cache = attn.KVCache(1, 4)
    ids = [cache.add_sequence(), cache.add_sequence(), cache.add_sequence()]
    ids.append(cache.fork(ids[0]))
    cache.drop(ids[1])
    assert cache.dtype is None and "dtype=None" in repr(cache)
    k = np.full((1, 2, 4), 1 + 2**-12, np.float16)
    cache.append(ids[3], k, k)
    assert cache.dtype == "float16"
    assert cache.sequence_ids == [0, 2, 3] and ids[1] not in cache
    assert cache.add_sequence() == 4 and cache.length(ids[3]) == 2 and cache.length(ids[0]) == 0
    np.testing.assert_array_equal(cache.keys(ids[3]), k.astype(np.float32))
    with pytest.raises(ValueError, match=r"^k: expected float16 \(the dtype this cache follows"):
        cache.append(ids[0], k.astype(np.float32), k)
    wide = attn.KVCache(1, 4)
    wide.append(wide.add_sequence(), np.full((1, 1, 4), 0.1), np.full((1, 1, 4), 0.1))
    assert wide.dtype == "float32" and wide.keys(0)[0, 0, 0] == np.float32(0.1)
    refused = attn.KVCache(1, 4)  # a first append that fails decides nothing
    with pytest.raises(ValueError, match=r"^k: expected shape"):
        refused.append(refused.add_sequence(), np.zeros((1, 1, 5), np.float16), np.zeros((1, 1, 4), np.float16))
    assert refused.dtype is None
    refused.append(0, np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32))
    assert refused.dtype == "float32"


def test_a_batch_of_ids_may_be_an_array_and_one_id_a_numpy_integer():
    cache = attn.KVCache(1, 4, dtype="float32")
    ids = np.array([cache.add_sequence(), cache.add_sequence()])
    k = np.arange(16, dtype=np.float32).reshape(2, 1, 2, 4)
    cache.append(ids, k, k)
    cache.append(np.int64(1), k[1], k[1])
    cache.append(0, k[0], k[0])
    with pytest.raises(TypeError, match=r"^seq: expected a sequence id \(int\) or a sequence of ids"):
        cache.append(np.array(0), k[0], k[0])  # a 0-d array is neither
    np.testing.assert_array_equal(cache.keys(0), np.concatenate([k[0], k[0]], axis=1))
    np.testing.assert_array_equal(cache.keys(1), np.concatenate([k[1], k[1]], axis=1))


def test_keys_and_values_of_two_dtypes_are_each_their_own_format():
    """dtype_v (llama.cpp's type_v beside type_k): int8 keys with a scale per group of 32 and
    int4 values, each within its format's bound, decode against float64 over the cache as it
    holds them, the pools in their two dtypes; dtype_v needs an explicit dtype."""
    rng = np.random.default_rng(3)
    cache = attn.KVCache(2, 64, 32, dtype="int8", dtype_v="int4", group=32, max_blocks=8)
    assert (cache.dtype, cache.dtype_v) == ("int8", "int4")
    seq = cache.add_sequence()
    k = rng.standard_normal((2, 40, 64)).astype(np.float32)
    v = rng.standard_normal((2, 40, 32)).astype(np.float32)
    for t in range(40):
        cache.append(seq, k[:, t:t + 1], v[:, t:t + 1])
    keys, values = cache.keys(seq), cache.values(seq)
    # int8: half a step of max |x| / 127; int4 (q4_0's d = m / -8, codes clamped to [-8, 7]):
    # up to a whole step of max |x| / 8 at -m.
    for given, stored, bound in ((k, keys, 0.5 / 127), (v, values, 1.0 / 8)):
        groups = given.reshape(2, 40, -1, 32)
        limit = np.abs(groups).max(axis=-1, keepdims=True) * bound * (1 + 1e-6)
        assert np.all(np.abs(groups - stored.reshape(groups.shape)) <= limit)
    q = rng.standard_normal((1, 4, 1, 64)).astype(np.float32)
    got = attn.decode(q, cache, [seq])
    want, _, _ = numpy_reference.attention(q, keys[None], values[None])
    assert np.mean((got - want) ** 2) / np.mean(want ** 2) < 1e-11
    key_pool, value_pool, key_scales, value_scales = cache.pools()
    assert (key_pool.dtype, value_pool.dtype) == (np.int8, np.uint8)
    assert value_pool.shape[-1] == 16 and key_scales.shape[-1] == 2 and value_scales.shape[-1] == 1
    table, seq_lens = cache.block_tables([seq])
    paged = attn.paged_attention(q[0].transpose(1, 0, 2), key_pool, value_pool, table, seq_lens,
                                 [0, 1], layout="head_major", kv_cache_dtype=("auto", "int4"),
                                 key_scales=key_scales, value_scales=value_scales)
    assert np.array_equal(paged, got[0].transpose(1, 0, 2))
    with pytest.raises(ValueError, match="^dtype_v: expected None"):
        attn.KVCache(2, 64, dtype_v="int8")
