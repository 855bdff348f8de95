"""Attention over key/value pages the caller owns, as serving engines hold their cache
(vLLM, FlashAttention's block_table, FlashInfer, transformers' continuous batching):
attn.paged_attention reads the pools in place for a ragged batch of prefill chunks and
decode steps, attn.append_pages writes new tokens into them. Nothing is copied: pools,
scales and tables are the caller's NumPy arrays or torch tensors, and the work runs with
the GIL released.

Batch invariance: a sequence's outputs are the same bits whatever else shares the call,
in any order, with any thread count, page size or layout, and however its prompt was cut
into prefill chunks."""

import numpy as np

from . import _arrays, _request
from ._attn import append_pages as _append_pages
from ._attn import paged_attention as _paged_attention
from ._errors import ArgumentTypeError, Error

LAYOUTS = ("token_major", "head_major")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "int4")
# vLLM's kv_cache_dtype "fp8" is e4m3.
_FORMAT_ALIASES = {"fp8": "fp8_e4m3"}
# float8 pools (torch's, or NumPy's through ml_dtypes) by dtype name: the format they hold.
_FLOAT8_FORMATS = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}

_REFUSES = (
    ("cu_seqlens_q", "query_start and seq_lens say where each sequence's queries and keys are"),
    ("cu_seqlens_k", "query_start and seq_lens say where each sequence's queries and keys are"),
    ("causal_align", "each sequence's queries are its newest tokens (bottom-right)"),
    ("block_mask", "seq_lens and the causal option say which keys each query sees"),
    ("position_bias", "paged attention does not take one"),
)


def _ints(x, name, dtype, ndim):
    """x (a sequence, NumPy array or torch tensor of integers) as a C-contiguous NumPy array
    of dtype with ndim dims; no copy when it already is one."""
    if _arrays.is_torch(x):
        _arrays.refuse_gradients(x, name)
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.size == 0 and a.dtype.kind == "f":
        a = a.astype(dtype)  # [] reads as float64
    if a.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{name}: expected integers, given dtype {a.dtype}")
    if a.ndim != ndim:
        raise Error(f"{name}: expected {ndim} dims, given shape {a.shape}")
    info = np.iinfo(dtype)
    if a.size and (a.min() < info.min or a.max() > info.max):
        raise Error(f"{name}: expected values that fit {np.dtype(dtype).name}, "
                    f"given {a.min()} to {a.max()}")
    return np.ascontiguousarray(a, dtype=dtype)


def _layout(layout):
    if layout not in LAYOUTS:
        raise Error(f"layout: expected 'token_major' or 'head_major', given {layout!r}")
    return layout


def _pool(x, name, written=False):
    if not (isinstance(x, np.ndarray) or _arrays.is_torch(x)):
        raise ArgumentTypeError(f"{name}: expected a NumPy array or a torch tensor (used in "
                                f"place), given {type(x).__name__}")
    if _arrays.is_torch(x):
        _arrays.refuse_gradients(x, name)
    elif written and not x.flags.writeable:
        raise Error(f"{name}: expected a writable array (append_pages writes in place), given a "
                    f"read-only one (a KVCache's pools are written through KVCache.append)")
    return _arrays.for_extension(x)


def _pools(key_cache, value_cache, kv_cache_dtype, written=False):
    """(key pool, value pool, (key format, value format)) as the extension takes them: float8
    pools as uint8 views of their codes, with the format their dtype names. kv_cache_dtype
    names both pools' format, or is a (keys, values) pair of them (K and V in two formats)."""
    pair = isinstance(kv_cache_dtype, (tuple, list)) and len(kv_cache_dtype) == 2
    formats = tuple(kv_cache_dtype) if pair else (kv_cache_dtype, kv_cache_dtype)
    if not all(isinstance(f, str) and f in KV_CACHE_DTYPES for f in formats):
        raise Error(f"kv_cache_dtype: expected one of {', '.join(map(repr, KV_CACHE_DTYPES))}, "
                    f"or a (keys, values) pair of them, given {kv_cache_dtype!r}")
    pools, named = [], []
    for x, name, given in zip((key_cache, value_cache), ("key_cache", "value_cache"), formats):
        x = _pool(x, name, written)
        given = _FORMAT_ALIASES.get(given, given)
        if given == "int8":  # what "auto" reads an int8 pool as, named
            if _arrays.dtype_name(x) != "int8":
                raise Error(f"{name}: expected a pool of 'int8', as kv_cache_dtype says, given "
                            f"{_arrays.dtype_name(x)}")
            given = "auto"
        held = _FLOAT8_FORMATS.get(_arrays.dtype_name(x))
        if held is not None:
            if given not in ("auto", held):
                raise Error(f"{name}: expected a pool of {given!r}, as kv_cache_dtype says, given "
                            f"{_arrays.dtype_name(x)}")
            given = held
            x = x.view(np.uint8) if isinstance(x, np.ndarray) else x.view(_arrays._torch().uint8)
        pools.append(x)
        named.append(given)
    return pools[0], pools[1], tuple(named)


def _scales(x, name, pool=None, kv_cache_dtype="auto", layout="token_major"):
    """Scales as the extension takes them: int8 and int4 pools' arrays as given (written in
    place by append_pages); an fp8 pool's scale per KV head as float32 [Hkv], a number or a
    one-element array (vLLM's k_scale) standing for every head."""
    if x is None:
        return None
    if kv_cache_dtype in ("fp8_e4m3", "fp8_e5m2"):
        if _arrays.is_torch(x):
            x = x.detach().cpu().float().numpy()
        try:
            a = np.asarray(x, dtype=np.float32)
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"{name}: expected a number or float array of one scale per "
                                    f"KV head, given {type(x).__name__}") from None
        if not np.all(np.isfinite(a) & (a > 0)):
            raise Error(f"{name}: expected positive finite scales, given {a.tolist()}")
        shape = _arrays.shape(pool)
        if a.size != 1 or len(shape) != 4:
            return a  # checked against the pool by the extension
        return np.full(shape[2 if layout == "token_major" else 1], a.reshape(()), np.float32)
    if not (isinstance(x, np.ndarray) or _arrays.is_torch(x)) or _arrays.dtype_name(x) != "float32":
        given = type(x).__name__
        if isinstance(x, np.ndarray) or _arrays.is_torch(x):
            given += f" of dtype {_arrays.dtype_name(x)}"
        raise ArgumentTypeError(f"{name}: expected a float32 array of one scale per token and "
                                f"KV head (written in place), given {given}")
    return x


def _rotary(rotary, rotary_cos, rotary_sin, rotary_dims, positions):
    """The extension's rotary keywords: the tables as float32 [positions, dims / 2], the
    positions as int32."""
    if rotary is not None and rotary not in ("neox", "interleaved"):
        raise Error(f"rotary: expected 'neox', 'interleaved' or None, given {rotary!r}")
    tables = []
    for table, name in ((rotary_cos, "rotary_cos"), (rotary_sin, "rotary_sin")):
        if table is not None:
            if _arrays.is_torch(table):
                table = table.detach().cpu().float().numpy()
            table = np.ascontiguousarray(np.asarray(table), np.float32)
            if table.ndim != 2:
                raise Error(f"{name}: expected 2 dims [positions, rotary_dims / 2], given shape {table.shape}")
        tables.append(table)
    dims = 0 if rotary_dims is None else _arrays.integer(rotary_dims, "rotary_dims", "an int")
    return dict(rotary=rotary, rotary_dims=dims, rotary_cos=tables[0], rotary_sin=tables[1],
                positions=None if positions is None else _ints(positions, "positions", np.int32, 1))


_ROTARY_DOC = """
    Rotary position embedding (fused): rotary="neox" (half-split pairs x[j], x[j + dims/2])
    or "interleaved" (GPT-J pairs x[2j], x[2j+1]) rotates the first rotary_dims elements of
    each row (all of D when None) by the angles whose cosines and sines are row p of
    rotary_cos and rotary_sin ([positions, rotary_dims / 2], the caller's frequencies and
    scaling), in float64, rounded once."""


def _rows(x, name, what):
    """x: [n, H, D] -> the [1, n, H, D] view the extension reads."""
    x = _arrays.as_array(x, name)
    if x.ndim != 3:
        raise Error(f"{name}: expected 3 dims [{what}, H, D], given shape {_arrays.shape(x)}")
    return _arrays.for_extension(_arrays.readable(_arrays.reshape(x, (1,) + _arrays.shape(x))))


def paged_attention(q, key_cache, value_cache, block_table, seq_lens, query_start, *,
                    layout="token_major", kv_cache_dtype="auto", key_scales=None,
                    value_scales=None, return_lse=False,
                    rotary=None, rotary_cos=None, rotary_sin=None, rotary_dims=None,
                    positions=None, **options):
    """Attention of a ragged batch of queries over the caller's pages.

    Shapes (S sequences, total_q queries in all):
        q:           [total_q, Hq, D], any float dtype; Hq a multiple of Hkv
        key_cache:   [pages, page_size, Hkv, D] (layout="token_major", as vLLM and
                     FlashAttention) or [pages, Hkv, page_size, D] ("head_major", as
                     FlashInfer's HND), float32, float16, bfloat16, int8 or float8
                     (float8_e4m3fn or float8_e5m2 of torch or ml_dtypes, or uint8 codes
                     with kv_cache_dtype "fp8_e4m3" (vLLM's "fp8") or "fp8_e5m2", as vLLM's
                     fp8 caches),
                     or int4 (uint8 [..., D / 2] of code pairs with kv_cache_dtype "int4",
                     as KVCache.pools() shows them), C-contiguous
        value_cache: the same with Dv for D, of the same dtype or another (K and V in two
                     formats, as llama.cpp's type_k and type_v): kv_cache_dtype then names
                     each, a (keys, values) pair such as ("int8", "int4"). "auto" reads a
                     pool by its dtype; "int8" says the same of an int8 pool, and is refused
                     for any other
        key_scales, value_scales: for int8 pools, float32, one scale per token and KV head
                     (x = int8 * its row's scale): [pages, page_size, Hkv] token_major,
                     [pages, Hkv, page_size] head_major; or one per group of D / G
                     elements of each row, [..., G] (G groups of 32, 64 or 128 elements);
                     int4 pools take them too. With zero points (asymmetric codes, as
                     KVCache(zero_point=True)), (scale, offset) pairs, [..., G, 2] (G = 1:
                     one pair a row): x = code * scale + offset, rounded to float32 once.
                     float8 pools: optional, one scale per KV
                     head, [Hkv] float32 or a number for every head (vLLM's k_scale and
                     v_scale): x = code * scale
        block_table: [S, max_pages] int32: sequence s's token t is in page
                     block_table[s, t // page_size] at slot t % page_size
        seq_lens:    [S] int32, each sequence's keys (its new tokens' included)
        query_start: [S + 1] int32: sequence s's queries are q[query_start[s]:query_start[s+1]]
        out:         [total_q, Hq, Dv] float32 (a torch tensor when q is one)
        lse:         [total_q, Hq] float32 (with return_lse=True)
    A sequence's queries are its newest tokens: query i of n_q sits at key position
    seq_lens[s] - n_q + i (plus position_offset). A sequence may have no query (it only holds
    keys this call) or more queries than keys (the ones at negative positions see no key
    under causal: out 0, lse -inf). causal hides each query's later keys; window, softcap,
    alibi_slopes, sinks and scale act as in attn.attention. With rotary, each query is
    rotated at positions[row] ([total_q] ints), or at its key position when positions is None
    (the keys were rotated when they were appended).
    """
    q = _arrays.as_array(q, "q")
    if q.ndim != 3:
        raise Error(f"q: expected 3 dims [total_q, Hq, D], given shape {_arrays.shape(q)}")
    q4 = _arrays.for_extension(_arrays.readable(_arrays.reshape(q, (1,) + _arrays.shape(q))))
    o = _request.options(q, options, "paged_attention", _REFUSES)
    key_pool, value_pool, formats = _pools(key_cache, value_cache, kv_cache_dtype)
    out, lse = _paged_attention(
        q4, key_pool, value_pool, _ints(block_table, "block_table", np.int32, 2),
        _ints(seq_lens, "seq_lens", np.int32, 1), _ints(query_start, "query_start", np.int32, 1),
        layout=_layout(layout), key_cache_dtype=formats[0], value_cache_dtype=formats[1],
        key_scales=_scales(key_scales, "key_scales", key_pool, formats[0], layout),
        value_scales=_scales(value_scales, "value_scales", value_pool, formats[1], layout),
        options=o,
        **_rotary(rotary, rotary_cos, rotary_sin, rotary_dims, positions))
    out, lse = (_arrays.like_kind(x, q)[0] for x in (out, lse))
    return (out, lse[..., 0]) if _arrays.flag(return_lse, "return_lse") else out


def append_pages(k, v, slots, key_cache, value_cache, *, layout="token_major",
                 kv_cache_dtype="auto", key_scales=None, value_scales=None, rotary=None,
                 rotary_cos=None, rotary_sin=None, rotary_dims=None, positions=None):
    """Writes n new tokens' keys and values into the caller's pages, in place: token i goes
    to page slots[i] // page_size at slot slots[i] % page_size (vLLM's slot_mapping); a
    negative slot skips the token (padding).

    Shapes: k [n, Hkv, D], v [n, Hkv, Dv] (any float dtype, rounded to the pools' dtype),
    slots [n] integers; pools and scales as in attn.paged_attention. int8: each token's row
    of each KV head is quantised once, with its own scale (max |x| / 127; with zero points,
    its own scale and offset over its [min, max]), so nothing written before changes.
    float8: each element (divided by its KV head's scale, with key_scales or value_scales)
    rounded to the nearest code (ties to even), magnitudes past the largest
    finite one (448 for e4m3, 57344 for e5m2) stored as it; int8 and float8 refuse keys or
    values that are not finite. A slot past the pool or given twice is refused, and then
    nothing is written. With rotary, each key is rotated at positions[i] ([n] ints,
    required) before it is stored.
    """
    key_pool, value_pool, formats = _pools(key_cache, value_cache, kv_cache_dtype, True)
    _append_pages(_rows(k, "k", "n"), _rows(v, "v", "n"), _ints(slots, "slots", np.int64, 1),
                  key_pool, value_pool, layout=_layout(layout), key_cache_dtype=formats[0],
                  value_cache_dtype=formats[1],
                  key_scales=_scales(key_scales, "key_scales", key_pool, formats[0], layout),
                  value_scales=_scales(value_scales, "value_scales", value_pool, formats[1],
                                       layout),
                  **_rotary(rotary, rotary_cos, rotary_sin, rotary_dims, positions))


paged_attention.__doc__ += _ROTARY_DOC + _request.OPTIONS_DOC
append_pages.__doc__ += _ROTARY_DOC
