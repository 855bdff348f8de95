"""Generation step by step: the attention state (attn.State, merge, finalize,
attention_state), the paged key/value cache (attn.KVCache) and attn.decode.

A state holds, for each query row and head, m (the largest visible score), l (the sum of
exp(score - m)) and acc (the sum of exp(score - m) v) over some set of keys. States over
disjoint key sets merge exactly, so attention over keys held in parts (a prefix and a
suffix, two caches, two machines) is the merge of each part's state, finalized once.
"""

import numpy as np

from . import _arrays
from ._errors import ArgumentTypeError, Error
from ._attention import _ALIGNMENTS, _input, _mask_view, _threads, _window
from ._attn import KVCache as _KVCache
from ._attn import decode as _decode
from ._attn import empty_state as _empty_state
from ._attn import finalize_state as _finalize_state
from ._attn import forward_state as _forward_state
from ._attn import merge_states as _merge_states

_CACHE_DTYPES = ("float32", "float16", "bfloat16", "int8")


class State:
    """The attention state of query rows over some keys (NumPy arrays, float32 or float64):

        m:   [B, H, Lq]      the largest visible score (-inf: no key seen)
        l:   [B, H, Lq]      sum of exp(score - m) over the keys
        acc: [B, H, Lq, Dv]  sum of exp(score - m) v over the keys

    Sinks are not part of a state (merging two states that each held a sink would count
    it twice): give them to finalize().
    """

    __slots__ = ("m", "l", "acc")

    def __init__(self, m, l, acc):
        self.m, self.l, self.acc = (np.asarray(x) for x in (m, l, acc))
        if self.acc.ndim != 4 or self.m.shape != self.acc.shape[:3] or self.l.shape != self.m.shape:
            raise Error(
                f"State: expected m and l of shape [B, H, Lq] and acc of shape [B, H, Lq, Dv] "
                f"with the same [B, H, Lq], given m {self.m.shape}, l {self.l.shape}, "
                f"acc {self.acc.shape}"
            )

    @classmethod
    def empty(cls, batch, heads, rows, dim_v, dtype="float32"):
        """The state of no keys: m = -inf, l = 0, acc = 0."""
        sizes = [_arrays.integer(x, name, "a non-negative int")
                 for x, name in ((batch, "batch"), (heads, "heads"), (rows, "rows"), (dim_v, "dim_v"))]
        return cls._from_extension(*_empty_state(dtype, *sizes))

    @classmethod
    def _from_extension(cls, m, l, acc):
        return cls(m[..., 0], l[..., 0], acc)

    def _for_extension(self):
        return self.m[..., None], self.l[..., None], self.acc

    def __repr__(self):
        return f"attn.State(shape={self.acc.shape}, dtype={self.acc.dtype})"


def _check_state(state, name):
    if not isinstance(state, State):
        raise ArgumentTypeError(f"{name}: expected an attn.State, given {type(state).__name__}")
    return state._for_extension()


def merge(a, b):
    """The state over the union of a's and b's keys (disjoint sets): exact, and merging
    with an empty state gives the other one unchanged. a, b: attn.State of the same shapes
    and dtype."""
    return State._from_extension(*_merge_states(*_check_state(a, "a"), *_check_state(b, "b")))


def finalize(state, sinks=None):
    """(out, lse) of a state: out = acc / l ([B, H, Lq, Dv], 0 where no key was seen) and
    lse = m + log l ([B, H, Lq], -inf where no key was seen), in the state's dtype.
    sinks: [H] numbers, an extra logit per head that takes weight and has no value."""
    out, lse = _finalize_state(*_check_state(state, "state"), _arrays.per_head(sinks, "sinks"))
    return out, lse[..., 0]


def attention_state(q, k, v, *, mask=None, causal=False, causal_align="top-left", scale=None,
                    window=(-1, -1), softcap=0.0, alibi_slopes=None, threads=None):
    """attn.attention as a State instead of a finalized output (no sinks: give them to
    finalize). q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]; keywords as in
    attn.attention. The state is float64 for float64 q, else float32."""
    q, k, v = (_arrays.as_array(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise Error(f"{name}: expected 4 dims [B, H, L, D], given shape {_arrays.shape(x)}")
    if causal_align not in _ALIGNMENTS:
        raise Error(f"causal_align: expected 'top-left' or 'bottom-right', given {causal_align!r}")
    q4, k4, v4 = (_input(x, "bhsd") for x in (q, k, v))
    mask4 = None
    if mask is not None:
        m = _arrays.as_array(mask, "mask", allow_bool=True)
        if m.ndim != 4:
            raise Error(f"mask: expected 4 dims [B or 1, H or 1, Lq, Lk], given shape {_arrays.shape(m)}")
        batch, heads, len_q, _ = _arrays.shape(q4)
        mask4 = _arrays.for_extension(_mask_view(m, (batch, heads), len_q, _arrays.shape(k4)[2], "mask"))
    left, right = _window(window)
    arrays = _forward_state(
        *(_arrays.for_extension(x) for x in (q4, k4, v4)), mask=mask4,
        scale=_arrays.number(scale, "scale", allow_none=True), causal=_arrays.flag(causal, "causal"),
        bottom_right=causal_align == "bottom-right", window_left=left, window_right=right,
        softcap=_arrays.number(softcap, "softcap"),
        alibi_slopes=_arrays.per_head(alibi_slopes, "alibi_slopes"), threads=_threads(threads, q),
    )
    return State._from_extension(*arrays)


class KVCache:
    """Paged key/value storage for many sequences, as vLLM's block table: a pool of blocks
    of page_size tokens, a block table per sequence, a free list for dropped sequences'
    blocks, and fork() sharing a prompt's blocks by reference count (copy-on-write for
    the last, partly filled block).

    heads_kv, dim, dim_v: the cached keys are [heads_kv, length, dim] and values
        [heads_kv, length, dim_v] per sequence (dim_v defaults to dim).
    dtype: the storage: "float32" (the default) keeps float16, bfloat16 and float32 keys
        and values exactly (float64 ones are rounded to float32); "float16", "bfloat16"
        and "int8" (per block and head scales, dequantised on the fly) trade precision for
        memory, by the caller's choice only.
    max_blocks: 0 lets the pool grow; else appends past it raise ValueError. Sizes whose
        block (heads_kv * page_size * dim * element size) could not fit in memory raise
        ValueError naming page_size.

    Threads: operations on different sequences may run from several threads at once;
    append and decode release the GIL, so appends to different sequences and decodes run
    in parallel. Operations on the same sequence from several threads are serialised (an
    append or drop waits for the decodes of that sequence that are running, and they wait
    for it), never interleaved.
    """

    def __init__(self, heads_kv, dim, dim_v=None, *, page_size=16, dtype="float32", max_blocks=0):
        if dtype not in _CACHE_DTYPES:
            raise Error(f"dtype: expected one of {', '.join(_CACHE_DTYPES)}, given {dtype!r}")
        sizes = {name: _arrays.integer(value, name, "an int")
                 for name, value in (("heads_kv", heads_kv), ("dim", dim),
                                     ("dim_v", dim if dim_v is None else dim_v),
                                     ("page_size", page_size), ("max_blocks", max_blocks))}
        self._cache = _KVCache(dtype=dtype, **sizes)
        self._torch_out = False  # keys() and values() return the kind appended last

    def add_sequence(self):
        """A new empty sequence's id (ids are never reused)."""
        return self._cache.add_sequence()

    def fork(self, parent):
        """A new sequence holding parent's tokens, sharing its blocks."""
        return self._cache.fork(_arrays.integer(parent, "parent", "a sequence id (int)"))

    def append(self, seq, k, v):
        """Appends n tokens to sequence seq. k: [heads_kv, n, dim]  v: [heads_kv, n, dim_v]
        (or [n, dim] and [n, dim_v] when heads_kv is 1), any float dtype."""
        seq = _arrays.integer(seq, "seq", "a sequence id (int)")
        self._torch_out = _arrays.is_torch(k)
        views = []
        for name, x in (("k", k), ("v", v)):
            x = _arrays.as_array(x, name)
            if x.ndim == 2:
                x = _arrays.reshape(x, (1,) + _arrays.shape(x))
            if x.ndim != 3:
                raise Error(f"{name}: expected 3 dims [heads_kv, n, dim], given shape {_arrays.shape(x)}")
            views.append(_arrays.for_extension(_arrays.readable(_arrays.reshape(x, (1,) + _arrays.shape(x)))))
        self._cache.append(seq, *views)

    def drop(self, seq):
        """Forgets sequence seq; blocks no other sequence holds are reused."""
        self._cache.drop(_arrays.integer(seq, "seq", "a sequence id (int)"))

    def length(self, seq):
        return self._cache.length(_arrays.integer(seq, "seq", "a sequence id (int)"))

    def __contains__(self, seq):
        return isinstance(seq, (int, np.integer)) and self._cache.contains(int(seq))

    @property
    def sequence_ids(self):
        return list(self._cache.sequence_ids())

    def block_table(self, seq):
        """The sequence's blocks in token order (token t is in block_table[t // page_size])."""
        return list(self._cache.block_table(_arrays.integer(seq, "seq", "a sequence id (int)")))

    def ref_count(self, block):
        """How many sequences hold the block (0: free)."""
        return self._cache.ref_count(_arrays.integer(block, "block", "a block index (int)",
                                                      low=-_arrays.INT_MAX - 1, high=_arrays.INT_MAX))

    def _out(self, array):
        return _arrays._torch().from_numpy(array) if self._torch_out else array

    def keys(self, seq):
        """The sequence's keys as float32 [heads_kv, length, dim] (dequantised); a torch
        tensor when the last append was given torch tensors, else a NumPy array."""
        return self._out(self._cache.keys(_arrays.integer(seq, "seq", "a sequence id (int)"))[0])

    def values(self, seq):
        """The sequence's values as float32 [heads_kv, length, dim_v] (dequantised), of the
        kind keys() returns."""
        return self._out(self._cache.values(_arrays.integer(seq, "seq", "a sequence id (int)"))[0])

    blocks_allocated = property(lambda self: self._cache.blocks_allocated)
    blocks_free = property(lambda self: self._cache.blocks_free)
    blocks_in_use = property(lambda self: self._cache.blocks_in_use)
    heads_kv = property(lambda self: self._cache.heads_kv)
    dim = property(lambda self: self._cache.dim)
    dim_v = property(lambda self: self._cache.dim_v)
    page_size = property(lambda self: self._cache.page_size)
    dtype = property(lambda self: self._cache.dtype)
    max_blocks = property(lambda self: self._cache.max_blocks)

    def __repr__(self):
        return (f"attn.KVCache(heads_kv={self.heads_kv}, dim={self.dim}, dim_v={self.dim_v}, "
                f"page_size={self.page_size}, dtype={self.dtype!r}, "
                f"sequences={len(self.sequence_ids)}, blocks_in_use={self.blocks_in_use})")


def _decode_call(q, cache, seq_ids, as_state, *, causal, scale, window, softcap, alibi_slopes,
                 sinks, threads):
    if not isinstance(cache, KVCache):
        raise ArgumentTypeError(f"cache: expected an attn.KVCache, given {type(cache).__name__}")
    q = _arrays.as_array(q, "q")
    if q.ndim not in (3, 4):
        raise Error(
            f"q: expected 3 dims [S, Hq, D] or 4 dims [S, Hq, n_q, D], given shape {_arrays.shape(q)}"
        )
    one_step = q.ndim == 3
    q4 = _arrays.readable(_arrays.reshape(q, _arrays.shape(q)[:2] + (1,) + _arrays.shape(q)[2:]) if one_step else q)
    if isinstance(seq_ids, (int, np.integer)) or not hasattr(seq_ids, "__len__"):
        raise ArgumentTypeError(f"seq_ids: expected a sequence of ids (one per row of q), given {seq_ids!r}")
    ids = [_arrays.integer(i, "seq_ids", "sequence ids (ints)") for i in seq_ids]
    left, right = _window(window)
    result = _decode(
        _arrays.for_extension(q4), cache._cache, ids,
        scale=_arrays.number(scale, "scale", allow_none=True), causal=_arrays.flag(causal, "causal"),
        window_left=left, window_right=right, softcap=_arrays.number(softcap, "softcap"),
        alibi_slopes=_arrays.per_head(alibi_slopes, "alibi_slopes"),
        sinks=_arrays.per_head(sinks, "sinks"), threads=_threads(threads, q), as_state=as_state,
    )
    return result, one_step


def decode(q, cache, seq_ids, *, causal=False, scale=None, window=(-1, -1), softcap=0.0,
           alibi_slopes=None, sinks=None, return_lse=False, threads=None):
    """One generation step: each sequence's newest queries against its cached keys.

    Shapes:
        q:   [S, Hq, D] (one new query per sequence) or [S, Hq, n_q, D] (n_q new queries,
             e.g. speculative decoding), any float dtype; Hq a multiple of cache.heads_kv
        seq_ids: S sequence ids of the cache, one per row of q
        out: [S, Hq, Dv] or [S, Hq, n_q, Dv], float32 (a torch tensor when q is one)
        lse: [S, Hq] or [S, Hq, n_q], float32 (with return_lse=True)
    The new tokens' keys and values are appended first: query i of a sequence of length L
    sits at key position L - n_q + i. causal hides, for each new query, the new keys after
    it; window, softcap, alibi_slopes and sinks act as in attn.attention. Long sequences
    are split over threads and merged in a fixed order: results do not depend on threads.
    """
    result, one_step = _decode_call(q, cache, seq_ids, False, causal=causal, scale=scale,
                                    window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                    sinks=sinks, threads=threads)
    out, lse = (_arrays.like_kind(x, q) for x in result)
    out, lse = (out[:, :, 0], lse[:, :, 0, 0]) if one_step else (out, lse[..., 0])
    return (out, lse) if _arrays.flag(return_lse, "return_lse") else out


def decode_state(q, cache, seq_ids, *, causal=False, scale=None, window=(-1, -1), softcap=0.0,
                 alibi_slopes=None, threads=None):
    """attn.decode as a float32 State over q's rows [S, Hq, n_q] (no sinks: give them to
    finalize), to merge with attention over keys held elsewhere. A 3-D q counts as n_q = 1."""
    result, _ = _decode_call(q, cache, seq_ids, True, causal=causal, scale=scale, window=window,
                             softcap=softcap, alibi_slopes=alibi_slopes, sinks=None,
                             threads=threads)
    return State._from_extension(*result)
