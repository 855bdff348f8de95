"""Generation step by step: the attention state (attn.State, merge, finalize,
attention_state), the paged key/value cache (attn.KVCache) and attn.decode.

A state holds, for each query row and head, m (the largest visible score), l (the sum of
exp(score - m)) and acc (the sum of exp(score - m) v) over some set of keys. States over
disjoint key sets merge exactly, so attention over keys held in parts (a prefix and a
suffix, two caches, two machines) is the merge of each part's state, finalized once.
"""

import threading

import numpy as np

from . import _arrays
from ._errors import ArgumentTypeError, Error
from . import _request
from ._attn import KVCache as _KVCache
from ._attn import decode as _decode
from ._attn import empty_state as _empty_state
from ._attn import finalize_state as _finalize_state
from ._attn import forward_state as _forward_state
from ._attn import merge_states as _merge_states

_CACHE_DTYPES = ("float32", "float16", "bfloat16", "int8", "int4", "fp8_e4m3", "fp8_e5m2")


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


# The ml_dtypes type a storage dtype's bits are shown as, when ml_dtypes imports.
_ML_DTYPES = {"bfloat16": "bfloat16", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def _ml_dtypes_view(bits, dtype):
    """An array of bfloat16 or fp8 bits (uint16, uint8) as ml_dtypes' type for the storage
    dtype when it imports, else as it is."""
    try:
        import ml_dtypes
    except ImportError:
        return bits
    return bits.view(getattr(ml_dtypes, _ML_DTYPES[dtype]))


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


def attention_state(q, k, v, *, mask=None, **options):
    """attn.attention as a State instead of a finalized output (no sinks: give them to
    finalize). q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]; mask and options as
    in attn.attention. The state is float64 for float64 q, else float32."""
    q, k, v = (_arrays.as_array(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise Error(f"{name}: expected 4 dims [B, H, L, D], given shape {_arrays.shape(x)}")
    o = _request.options(q, options, "attention_state", _STATE_REFUSES)
    q4, k4, v4 = (_request.input_view(x, "bhsd") for x in (q, k, v))
    mask4 = None
    if mask is not None:
        m = _arrays.as_array(mask, "mask", allow_bool=True)
        if m.ndim != 4:
            raise Error(f"mask: expected 4 dims [B or 1, H or 1, Lq, Lk], given shape {_arrays.shape(m)}")
        batch, heads, len_q, _ = _arrays.shape(q4)
        mask4 = _request.broadcast_mask(m, (batch, heads), len_q, _arrays.shape(k4)[2], "mask")
    ext = _request.ext
    arrays = _forward_state(ext(q4), ext(k4), ext(v4), mask=ext(mask4), options=o)
    return State._from_extension(*arrays)


_STATE_REFUSES = (("sinks", "give them to attn.finalize, which counts them once"),
                  ("cu_seqlens_q", "a state has one segment per batch entry"),
                  ("cu_seqlens_k", "a state has one segment per batch entry"))
attention_state.__doc__ += _request.OPTIONS_DOC


def _head_scales(x, name, heads_kv):
    """An fp8 cache's scales per KV head as the extension takes them: a list of heads_kv
    floats (one number or one-element array standing for every head), [] for none."""
    if x is None:
        return []
    if _arrays.is_torch(x):
        x = x.detach().cpu().double().numpy()
    try:
        a = np.asarray(x, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{name}: expected a number or an array of one scale per KV "
                                f"head, given {type(x).__name__}") from None
    return [float(s) for s in (np.full(heads_kv, a[0]) if a.size == 1 else a)]


class KVCache:
    """Paged key/value storage for many sequences, as vLLM's block table: a pool of blocks
    of page_size tokens, a block table per sequence, a free list for dropped sequences'
    blocks, and fork() sharing a prompt's blocks by reference count (copy-on-write for
    the last, partly filled block).

    heads_kv, dim, dim_v: the cached keys are [heads_kv, length, dim] and values
        [heads_kv, length, dim_v] per sequence (dim_v defaults to dim).
    dtype: the storage. None (the default) follows the data, as a cache of torch tensors
        would: the first append fixes it to the keys' and values' dtype (float16, bfloat16
        or float32; float32 for float64, attn's working precision, and for keys and values
        of two different dtypes), and a later append that the storage would round (float32
        into a float16 cache, say) raises ValueError. "float32", "float16", "bfloat16" and
        "int8" (a scale per token and head, quantised once, dequantised on the fly), "int4"
        (two codes a byte, a scale per token and head or group chosen as llama.cpp's q4_0
        chooses it; dim and dim_v multiples of 32),
        "fp8_e4m3" and "fp8_e5m2" (vLLM's fp8 caches: each element rounded to the nearest
        8-bit float, magnitudes past 448 or 57344 stored as the largest) are the caller's
        choice and round what does not fit, without a word: float32 keeps float16, bfloat16
        and float32 data exactly. int8 and fp8 refuse keys and values that are not finite.
    dtype_v: the values' storage where it is not the keys' (llama.cpp's type_v beside type_k:
        K and V tolerate different formats), one of the names dtype takes; None (the
        default): dtype. Needs an explicit dtype. group and zero_point apply to each side that
        is int8 or int4, k_scale and v_scale to an fp8 side. The dtype and dtype_v properties
        tell the two.
    group: int8 and int4: 32, 64 or 128 (dividing dim and dim_v) gives each group of that many
        elements of a token's row its own scale, as llama.cpp's q8_0 blocks of 32 and
        OpenVINO's group size, so that an outlier channel coarsens only its own group; 0
        (the default) one scale per token and head.
    zero_point: int8 and int4: asymmetric codes (llama.cpp's q4_1, OpenVINO's u8 and u4 with
        zero points): each row (or group) keeps an offset beside its scale, an element
        reading as code * scale + offset, so the codes span its own [min, max]; each element
        within half a step ((max - min) / 255 or / 15) plus 2^-22 of its largest magnitude.
        False (the default): symmetric codes, as above.
    k_scale, v_scale: fp8 only: a scale per KV head for the keys and one for the values
        (vLLM's k_scale and v_scale, per head; a number for every head), positive and
        finite: each element is stored as the code of x / scale and reads as code * scale.
        None (the default): 1.
    max_blocks: 0 lets the pool grow; else appends past it raise ValueError, and the blocks
        lie in one allocation, which pools() shows to attn.paged_attention. Sizes whose
        block (heads_kv * page_size * dim * element size) could not fit in memory raise
        ValueError naming page_size.

    Threads: operations on different sequences may run from several threads at once;
    append and decode release the GIL, so appends to different sequences and decodes run
    in parallel. Operations on the same sequence from several threads are serialised (an
    append or drop waits for the decodes of that sequence that are running, and they wait
    for it), never interleaved.
    """

    def __init__(self, heads_kv, dim, dim_v=None, *, page_size=16, dtype=None, dtype_v=None,
                 group=0, zero_point=False, max_blocks=0, k_scale=None, v_scale=None):
        if dtype is not None and dtype not in _CACHE_DTYPES:
            raise Error(f"dtype: expected one of None (follow the data), {', '.join(_CACHE_DTYPES)}, "
                        f"given {dtype!r}")
        if dtype_v is not None and (dtype is None or dtype_v not in _CACHE_DTYPES):
            raise Error(f"dtype_v: expected None (as dtype), or one of {', '.join(_CACHE_DTYPES)} "
                        f"beside an explicit dtype, given {dtype_v!r} with dtype {dtype!r}")
        self._dtype_v = dtype_v
        self._sizes = {name: _arrays.integer(value, name, "an int")
                       for name, value in (("heads_kv", heads_kv), ("dim", dim),
                                           ("dim_v", dim if dim_v is None else dim_v),
                                           ("page_size", page_size), ("group", group),
                                           ("max_blocks", max_blocks))}
        if not isinstance(zero_point, (bool, np.bool_)):
            raise ArgumentTypeError(f"zero_point: expected a bool, given "
                                    f"{type(zero_point).__name__}")
        self._sizes["zero_point"] = bool(zero_point)
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            self._sizes[name] = _head_scales(scale, name, self._sizes["heads_kv"])
        # Until the first append, a dtype that follows the data is undecided: the extension's
        # cache is a float32 one (the widest, so the size checks hold for any choice) holding
        # only empty sequences, rebuilt in the chosen dtype under _choosing.
        self._cache = _KVCache(dtype=dtype or "float32", dtype_v=dtype_v or dtype or "float32",
                               **self._sizes)
        self._follows_data = dtype is None
        self._undecided = dtype is None
        self._ids_issued = 0  # while undecided: add_sequence and fork ids given out (0, 1, ...)
        self._choosing = threading.Lock()
        self._torch_out = False  # keys() and values() return the kind appended last

    def _new_id(self, make):
        if not self._undecided:
            return make()
        with self._choosing:  # not while the first append rebuilds the extension's cache
            seq = make()
            self._ids_issued = max(self._ids_issued, seq + 1)
            return seq

    def add_sequence(self):
        """A new empty sequence's id (ids are never reused)."""
        return self._new_id(self._cache.add_sequence)

    def fork(self, parent):
        """A new sequence holding parent's tokens, sharing its blocks."""
        parent = _arrays.integer(parent, "parent", "a sequence id (int)")
        return self._new_id(lambda: self._cache.fork(parent))

    def _storage_for(self, dtypes):
        """The storage a dtype that follows the data takes for keys and values of dtypes."""
        if len(set(dtypes)) == 1 and dtypes[0] in ("float16", "bfloat16"):
            return dtypes[0]
        return "float32"

    def _check_exact(self, views):
        """A dtype that followed the data stores later appends exactly, or refuses them:
        float32 storage holds float16 and bfloat16 exactly (and float64 as attn computes)."""
        stored = self._cache.dtype
        for name, x in views:
            given = _arrays.dtype_name(x)
            if given != stored and stored != "float32":
                raise Error(
                    f"{name}: expected {stored} (the dtype this cache follows, from its first "
                    f"append), given {given}, which {stored} storage would round; convert it, "
                    f"or create the KVCache with an explicit dtype (\"float32\" keeps both)")

    def _decide(self, views):
        """At the first append: the storage of a dtype that follows the data, the extension's
        cache rebuilt in it with the same (empty) sequences."""
        chosen = self._storage_for([_arrays.dtype_name(x) for _, x in views])
        if chosen != self._cache.dtype:
            live = set(self._cache.sequence_ids())
            cache = _KVCache(dtype=chosen, dtype_v=chosen, **self._sizes)
            for seq in range(self._ids_issued):
                cache.add_sequence()  # the same ids: the extension gives out 0, 1, ...
                if seq not in live:
                    cache.drop(seq)
            self._cache = cache

    def append(self, seq, k, v):
        """Appends n tokens to one sequence or to each of a batch of them.

        One sequence: seq an id, k: [heads_kv, n, dim]  v: [heads_kv, n, dim_v] (or [n, dim]
            and [n, dim_v] when heads_kv is 1).
        A batch: seq a sequence of S distinct ids, k: [S, heads_kv, n, dim]  v: [S, heads_kv,
            n, dim_v]; row s goes to seq[s], as S single appends would (a decode step's new
            tokens in one call, the GIL released once). If the pool runs out (max_blocks)
            part way, the error names the first id not appended; the ones before it were.
        k and v: float16, bfloat16, float32 or float64 (see dtype in the class's doc).
        """
        batch = (not isinstance(seq, (int, np.integer)) and hasattr(seq, "__len__")
                 and getattr(seq, "ndim", 1) != 0)
        if batch:
            ids = [_arrays.integer(i, "seq", "sequence ids (ints)") for i in seq]
            counts = {}
            for i in ids:
                counts[i] = counts.get(i, 0) + 1
            repeated = [i for i, c in counts.items() if c > 1]
            if repeated:
                raise Error(f"seq: expected distinct sequence ids, given {repeated[0]} "
                            f"{counts[repeated[0]]} times")
            for at, i in enumerate(ids):
                if not self._cache.contains(i):
                    raise Error(f"seq: expected ids of sequences in the cache, given {i} at position {at}")
            seq = ids
        else:
            seq = _arrays.integer(seq, "seq", "a sequence id (int) or a sequence of ids")
        views = []
        for name, x in (("k", k), ("v", v)):
            x = _arrays.as_array(x, name)
            if batch:
                if x.ndim != 4 or _arrays.shape(x)[0] != len(ids):
                    raise Error(f"{name}: expected 4 dims [{len(ids)}, heads_kv, n, dim] (one row per "
                                f"id of seq), given shape {_arrays.shape(x)}")
            else:
                if x.ndim == 2:
                    x = _arrays.reshape(x, (1,) + _arrays.shape(x))
                if x.ndim != 3:
                    raise Error(f"{name}: expected 3 dims [heads_kv, n, dim], given shape "
                                f"{_arrays.shape(x)}")
                x = _arrays.reshape(x, (1,) + _arrays.shape(x))
            views.append((name, _arrays.readable(x)))
        if batch and _arrays.shape(views[0][1])[2] != _arrays.shape(views[1][1])[2]:
            raise Error(f"v: expected n = {_arrays.shape(views[0][1])[2]} tokens (as k), given shape "
                        f"{_arrays.shape(views[1][1])}")
        if self._undecided:
            with self._choosing:
                if self._undecided:
                    self._decide(views)
                    try:
                        self._append(seq, views, batch)
                        self._undecided = False
                    finally:  # a batch that failed part way has stored tokens all the same
                        self._undecided = self._undecided and self._cache.blocks_allocated == 0
                    return
        self._append(seq, views, batch)

    def _append(self, seq, views, batch):
        if self._follows_data:
            self._check_exact(views)
        arrays = [_arrays.for_extension(x) for _, x in views]
        if batch:
            self._cache.append_batch(seq, *arrays)
        else:
            self._cache.append(seq, *arrays)
        self._torch_out = _arrays.is_torch(views[0][1])

    def drop(self, seq):
        """Forgets sequence seq; blocks no other sequence holds are reused."""
        seq = _arrays.integer(seq, "seq", "a sequence id (int)")
        if not self._undecided:
            return self._cache.drop(seq)
        with self._choosing:
            return self._cache.drop(seq)

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

    def pools(self):
        """The cache's pages as attn.paged_attention reads them, in place:
        (key_cache, value_cache, key_scales, value_scales), read-only NumPy arrays on the
        cache's memory, head-major: key_cache [max_blocks, heads_kv, page_size, dim],
        value_cache the same with dim_v, in the storage dtype (bfloat16 and fp8 as ml_dtypes'
        bfloat16, float8_e4m3fn and float8_e5m2 when it imports, else their uint16 bits,
        which paged_attention reads as bfloat16, and uint8 codes, which it reads with
        kv_cache_dtype="fp8_e4m3" or "fp8_e5m2"; int4 as uint8 [..., dim / 2] code
        pairs, read with kv_cache_dtype="int4"); the scales float32 [max_blocks, heads_kv,
        page_size] for int8 and int4 ([..., dim / group] with a group; with zero_point
        [..., groups, 2], (scale, offset) pairs, groups 1 without a group), fp8's k_scale
        and v_scale [heads_kv], else None. Block
        numbers are page numbers: with block_tables(ids), a ragged batch over the cache is

            kc, vc, ks, vs = cache.pools()
            table, seq_lens = cache.block_tables(ids)
            out = attn.paged_attention(q, kc, vc, table, seq_lens, query_start,
                                       layout="head_major", key_scales=ks, value_scales=vs)

        Needs max_blocks > 0 (the blocks then lie in one allocation) and a decided dtype.
        The arrays keep the cache alive and see later appends; append through append(),
        never into the arrays, and not to a sequence while a paged_attention call reads it.
        """
        if self._undecided and self.max_blocks > 0:  # else the extension names max_blocks
            raise Error("dtype: expected a cache whose storage dtype is known (pass dtype= to "
                        "KVCache, or append first), given a cache that follows the data and "
                        "holds none yet")
        pools = list(self._cache.pools())
        for i, dtype in ((0, self.dtype), (1, self.dtype_v)):
            if dtype in _ML_DTYPES:
                pools[i] = _ml_dtypes_view(pools[i], dtype)
        return tuple(pools)

    def block_tables(self, seq_ids):
        """(block_table, seq_lens) of the ids for attn.paged_attention over pools(), read at
        one moment: block_table int32 [S, max_pages] (each row the sequence's blocks in token
        order, padded with 0, which is not read), seq_lens int32 [S]."""
        ids = [_arrays.integer(i, "seq_ids", "sequence ids (ints)") for i in seq_ids]
        return tuple(self._cache.block_tables(ids))

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
    dtype = property(lambda self: None if self._undecided else self._cache.dtype,
                     doc="The storage dtype; None until the first append when it follows the data.")
    dtype_v = property(lambda self: None if self._undecided else self._cache.dtype_v,
                       doc="The values' storage dtype (dtype unless dtype_v was given).")
    max_blocks = property(lambda self: self._cache.max_blocks)
    group = property(lambda self: self._cache.group,
                     doc="int8's and int4's elements per scale along the head dim; 0: a scale "
                         "per row.")
    k_scale = property(lambda self: self._cache.k_scale or None,
                       doc="fp8's scale per KV head of the keys; None for 1.")
    v_scale = property(lambda self: self._cache.v_scale or None,
                       doc="fp8's scale per KV head of the values; None for 1.")
    zero_point = property(lambda self: self._cache.zero_point,
                          doc="Whether int8's and int4's codes are asymmetric, an offset beside "
                              "each scale.")

    def __repr__(self):
        return (f"attn.KVCache(heads_kv={self.heads_kv}, dim={self.dim}, dim_v={self.dim_v}, "
                f"page_size={self.page_size}, dtype={self.dtype!r}, "
                f"sequences={len(self.sequence_ids)}, blocks_in_use={self.blocks_in_use})")


_DECODE_REFUSES = (("causal_align", "a decode step's queries are the newest tokens (bottom-right)"),
                   ("cu_seqlens_q", "each sequence of the cache is its own"),
                   ("cu_seqlens_k", "each sequence of the cache is its own"),
                   ("block_mask", "the cache says which keys each sequence has"),
                   ("position_bias", "decode does not take one"))


def _decode_call(q, cache, seq_ids, as_state, options, function, refused=_DECODE_REFUSES):
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
    o = _request.options(q, options, function, refused)
    result = _decode(_arrays.for_extension(q4), cache._cache, ids, options=o, as_state=as_state)
    return result, one_step


def decode(q, cache, seq_ids, *, return_lse=False, **options):
    """One generation step: each sequence's newest queries against its cached keys.

    Shapes:
        q:   [S, Hq, D] (one new query per sequence) or [S, Hq, n_q, D] (n_q new queries,
             e.g. speculative decoding), any float dtype; Hq a multiple of cache.heads_kv
        seq_ids: S sequence ids of the cache, one per row of q
        out: [S, Hq, Dv] or [S, Hq, n_q, Dv], float32 (a torch tensor when q is one)
        lse: [S, Hq] or [S, Hq, n_q], float32 (with return_lse=True)
    The new tokens' keys and values are appended first: query i of a sequence of length L
    sits at key position L - n_q + i (plus position_offset). causal hides, for each new
    query, the new keys after it; window, softcap, alibi_slopes and sinks act as in
    attn.attention (causal_align and cu_seqlens do not apply). Long sequences are split over
    threads and merged in a fixed order: results do not depend on threads.
    """
    result, one_step = _decode_call(q, cache, seq_ids, False, options, "decode")
    out, lse = (_arrays.like_kind(x, q) for x in result)
    out, lse = (out[:, :, 0], lse[:, :, 0, 0]) if one_step else (out, lse[..., 0])
    return (out, lse) if _arrays.flag(return_lse, "return_lse") else out


def decode_state(q, cache, seq_ids, **options):
    """attn.decode as a float32 State over q's rows [S, Hq, n_q] (no sinks: give them to
    finalize), to merge with attention over keys held elsewhere. A 3-D q counts as n_q = 1."""
    refused = _DECODE_REFUSES + (("sinks", "give them to attn.finalize, which counts them once"),)
    result, _ = _decode_call(q, cache, seq_ids, True, options, "decode_state", refused)
    return State._from_extension(*result)


decode.__doc__ += _request.OPTIONS_DOC
decode_state.__doc__ += _request.OPTIONS_DOC
