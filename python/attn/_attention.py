"""attn.attention (FlashAttention-style keywords) and attn.scaled_dot_product_attention
(PyTorch's signature): both shape the caller's arrays into 4-D [B, H, S, D] views,
allocate the outputs, and let the extension write into them."""

import math

import numpy as np

from . import _arrays
from ._attn import describe_view as _describe_view
from ._attn import forward as _forward

_LAYOUTS = ("bhsd", "bshd")
_ALIGNMENTS = ("top-left", "bottom-right")


def _rank_error(name, x, layout):
    if layout == "bhsd":
        forms = "[L, D], [H, L, D] or [B, H, L, D]"
    else:
        forms = "[L, D], [L, H, D] or [B, L, H, D]"
    return ValueError(
        f"{name}: expected 2, 3 or 4 dims ({forms} for layout '{layout}'), "
        f"given {x.ndim} dims with shape {_arrays.shape(x)}"
    )


def _to_bhsd(x, layout):
    """x: [L, D] | [H, L, D] | [B, H, L, D] (bhsd) or [L, D] | [L, H, D] | [B, L, H, D]
    (bshd) -> a [B, H, L, D] view of the same memory."""
    dims = _arrays.shape(x)
    if x.ndim == 2 or layout == "bhsd":
        return _arrays.reshape(x, (1,) * (4 - x.ndim) + dims)
    return _arrays.permute(_arrays.reshape(x, (1,) * (4 - x.ndim) + dims), (0, 2, 1, 3))


def _input(x, layout):
    """The [B, H, L, D] view attention() hands to the extension for an input x."""
    return _arrays.readable(_to_bhsd(x, layout))


def describe_input(x, layout="bhsd"):
    """What the kernels see of x when attention() receives it: a dict with the address,
    dtype, [B, H, L, D] shape and element strides. For checking that inputs are read in
    place (the address is the caller's) or were copied."""
    array = _arrays.as_array(x, "x")
    return _describe_view(_arrays.for_extension(_input(array, layout)), "x")


def _user_shape(bhsd, rank, layout):
    """[B, H, L, D] -> the shape of that array in the caller's rank and layout."""
    batch, heads, length, dim = bhsd
    if rank == 2:
        return (length, dim)
    if layout == "bhsd":
        return (batch, heads, length, dim)[4 - rank :]
    return (batch, length, heads, dim)[4 - rank :]


def _mask_view(mask, heads_shape, len_q, len_k, name):
    """mask: 4-D [B or 1, H or 1, Lq or 1, Lk or 1] -> [B or 1, H or 1, Lq, Lk], with Lq and
    Lk broadcast (stride 0, or a copy where the last dim must become contiguous)."""
    dims = _arrays.shape(mask)
    batch, heads = heads_shape
    fits = (
        dims[0] in (1, batch)
        and dims[1] in (1, heads)
        and dims[2] in (1, len_q)
        and dims[3] in (1, len_k)
    )
    if not fits:
        raise ValueError(
            f"{name}: expected a shape broadcastable to [{batch}, {heads}, {len_q}, {len_k}] "
            f"(batch, query heads, query length, key length), given {dims}"
        )
    return _arrays.readable(_arrays.broadcast(mask, dims[:2] + (len_q, len_k)))


def _window(window):
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window: expected a pair (left, right) of ints, given {window!r}")
    expected = "an int (-1 for unbounded)"
    return (_arrays.integer(window[0], "window.left", expected),
            _arrays.integer(window[1], "window.right", expected))


def _threads(threads):
    if threads is None:
        return 0
    threads = _arrays.integer(threads, "threads", "None or a positive int", high=_arrays.INT_MAX)
    if threads < 1:
        raise ValueError(f"threads: expected None or a positive int, given {threads}")
    return threads


def ext(x):
    """An array as the extension takes it, or None."""
    return None if x is None else _arrays.for_extension(x)


def _run(q, k, v, out, *, lse=None, weights=None, mask=None, scale=None, causal=False,
         bottom_right=False, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=(),
         sinks=(), cu_seqlens_q=(), cu_seqlens_k=(), threads=0):
    """Every array here is a 4-D [B, H, S, D] view the extension reads or writes in place."""
    _forward(
        ext(q), ext(k), ext(v),
        out=ext(out), lse=ext(lse), weights=ext(weights), mask=ext(mask),
        scale=scale, causal=causal, bottom_right=bottom_right,
        window_left=window_left, window_right=window_right, softcap=softcap,
        alibi_slopes=list(alibi_slopes), sinks=list(sinks),
        cu_seqlens_q=list(cu_seqlens_q), cu_seqlens_k=list(cu_seqlens_k), threads=threads,
    )


def attention(q, k, v, *, mask=None, causal=False, causal_align="top-left", scale=None,
              window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
              cu_seqlens_q=None, cu_seqlens_k=None, layout="bhsd", return_lse=False,
              return_weights=False, threads=None):
    """Exact attention: out = softmax(scale * q k^T + bias) v, one query row at a time.

    Shapes (layout="bhsd"; layout="bshd" swaps the L and H axes of q, k, v and out):
        q:    [Lq, D] | [Hq, Lq, D] | [B, Hq, Lq, D]
        k:    [Lk, D] | [Hkv, Lk, D] | [B, Hkv, Lk, D]   (Hq a multiple of Hkv: GQA / MQA)
        v:    [Lk, Dv] | [Hkv, Lk, Dv] | [B, Hkv, Lk, Dv]
        out:  like q with D replaced by Dv, in q's dtype and layout
        lse:  [Lq] | [Hq, Lq] | [B, Hq, Lq] (any layout), float32 (float64 for float64 q)
        weights: [Lq, Lk] | [Hq, Lq, Lk] | [B, Hq, Lq, Lk], float32 (float64 for float64 q)
    q, k and v have the same rank. Inputs are NumPy arrays, torch tensors (CPU) or other
    DLPack producers in float16, bfloat16, float32 or float64; they are read in place when
    the last dim is contiguous and copied otherwise. Outputs are NumPy arrays, or torch
    tensors when q is a torch tensor.

    Keywords (every default means "off"):
        mask: bool (True = may attend, as in PyTorch) or float (added to the score; -inf
            hides the key), broadcastable to [B, Hq, Lq, Lk] with the same leading-dim
            rules as NumPy.
        causal: hide keys after the query's position.
        causal_align: "top-left" (PyTorch: query i sits at key i) or "bottom-right"
            (FlashAttention: query i sits at key i + Lk - Lq). Also places the window and
            ALiBi distances.
        scale: multiplies q.k; None means 1/sqrt(D).
        window: (left, right): the query at key position p sees keys p-left .. p+right;
            -1 is unbounded on that side.
        softcap: > 0 caps scores as softcap * tanh(score / softcap); 0.0 is off.
        alibi_slopes: [Hq] numbers; subtracts slope * |query position - key position|.
        sinks: [Hq] numbers; an extra logit per head that takes weight but has no value.
        cu_seqlens_q, cu_seqlens_k: packed variable-length sequences (flash_attn_varlen):
            B = 1 and sequence s owns rows cu_seqlens_q[s]:cu_seqlens_q[s+1] of q and
            cu_seqlens_k[s]:cu_seqlens_k[s+1] of k and v. Give both or neither.
        layout: "bhsd" or "bshd" (see Shapes).
        return_lse, return_weights: also return lse (log-sum-exp of each row's visible
            scores, sinks included) and the softmax weights, in that order.
        threads: None uses ATTN_NUM_THREADS from the environment, else every core; an int
            bounds the kernel's threads. Results do not depend on it.

    A row that sees no key gives zeros (and lse = -inf), never NaN. The GIL is released
    while the kernel runs. Bad input raises ValueError or TypeError naming the argument.

    Returns out, or a tuple (out, lse, weights) holding the ones asked for.
    """
    q, (k, v), options, layout_view = prepare(
        q, (("k", k), ("v", v)), mask=mask, causal=causal, causal_align=causal_align,
        scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, layout=layout, threads=threads)
    return_lse = _arrays.flag(return_lse, "return_lse")
    return_weights = _arrays.flag(return_weights, "return_weights")
    rank = q.ndim
    q4, k4, v4 = (layout_view(x) for x in (q, k, v))
    batch, heads, len_q, _ = _arrays.shape(q4)
    len_k, dim_v = _arrays.shape(v4)[2], _arrays.shape(v4)[3]
    mask4 = mask_view(mask, (batch, heads), len_q, len_k)

    out = _arrays.empty(q, _user_shape((batch, heads, len_q, dim_v), rank, layout), _arrays.dtype_name(q))
    results = [out]
    lse4 = weights4 = None
    if return_lse:
        lse = _arrays.empty(q, (batch, heads, len_q)[4 - rank :], _arrays.stats_dtype(q))
        lse4 = _arrays.reshape(lse, (batch, heads, len_q, 1))
        results.append(lse)
    if return_weights:
        _arrays.check_memory(
            f"return_weights: the weights {[batch, heads, len_q, len_k]}", (batch, heads, len_q, len_k),
            np.dtype(_arrays.stats_dtype(q)).itemsize,
            "leave out return_weights, or use attn.weights with heads=, rows= or top_k")
        weights = _arrays.empty(q, (batch, heads, len_q, len_k)[4 - rank :], _arrays.stats_dtype(q))
        weights4 = _arrays.reshape(weights, (batch, heads, len_q, len_k))
        results.append(weights)

    _run(q4, k4, v4, _to_bhsd(out, layout), lse=lse4, weights=weights4, mask=mask4, **options)
    return out if len(results) == 1 else tuple(results)


def prepare(q, others, *, mask, causal, causal_align, scale, window, softcap, alibi_slopes,
            sinks, cu_seqlens_q, cu_seqlens_k, layout, threads):
    """The checks attn.attention and attn.weights share. others: (name, array) pairs of
    the same rank as q. Returns (q, [others as arrays], the extension's option keywords,
    a function taking an input to its [B, H, L, D] view)."""
    q = _arrays.as_array(q, "q")
    others = [(name, _arrays.as_array(x, name)) for name, x in others]
    if layout not in _LAYOUTS:
        raise ValueError(f"layout: expected 'bhsd' or 'bshd', given {layout!r}")
    if causal_align not in _ALIGNMENTS:
        raise ValueError(f"causal_align: expected 'top-left' or 'bottom-right', given {causal_align!r}")
    rank = q.ndim
    if rank not in (2, 3, 4):
        raise _rank_error("q", q, layout)
    for name, x in others:
        if x.ndim != rank:
            raise ValueError(
                f"{name}: expected {rank} dims (as q), given {x.ndim} dims with shape "
                f"{_arrays.shape(x)}"
            )
    causal = _arrays.flag(causal, "causal")
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    window_left, window_right = _window(window)
    options = dict(
        scale=_arrays.number(scale, "scale", allow_none=True),
        causal=causal,
        bottom_right=causal_align == "bottom-right",
        window_left=window_left,
        window_right=window_right,
        softcap=_arrays.number(softcap, "softcap"),
        alibi_slopes=_arrays.per_head(alibi_slopes, "alibi_slopes"),
        sinks=_arrays.per_head(sinks, "sinks"),
        cu_seqlens_q=[] if cu_seqlens_q is None else _arrays.offsets(cu_seqlens_q, "cu_seqlens_q"),
        cu_seqlens_k=[] if cu_seqlens_k is None else _arrays.offsets(cu_seqlens_k, "cu_seqlens_k"),
        threads=_threads(threads),
    )
    if packed and (cu_seqlens_q is None or cu_seqlens_k is None):
        missing = "cu_seqlens_k" if cu_seqlens_k is None else "cu_seqlens_q"
        raise ValueError(f"{missing}: expected offsets (give both cu_seqlens or neither), given None")
    return q, [x for _, x in others], options, lambda x: _input(x, layout)


def mask_view(mask, heads_shape, len_q, len_k):
    """attn.attention's mask (None, or 2 to 4 dims broadcastable to [B, H, Lq, Lk]) as the
    [B or 1, H or 1, Lq, Lk] view the extension reads, or None."""
    if mask is None:
        return None
    m = _arrays.as_array(mask, "mask", allow_bool=True)
    if not 2 <= m.ndim <= 4:
        raise ValueError(
            f"mask: expected 2 to 4 dims ([..., Lq, Lk]), given {m.ndim} dims with shape "
            f"{_arrays.shape(m)}"
        )
    m4 = _arrays.reshape(m, (1,) * (4 - m.ndim) + _arrays.shape(m))
    return _mask_view(m4, heads_shape, len_q, len_k, "mask")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, computed by attn.

    Shapes, as in PyTorch:
        query: [..., Hq, L, E]   key: [..., Hkv, S, E]   value: [..., Hkv, S, Ev]
        attn_mask: broadcastable to [..., Hq, L, S]; bool (True = may attend) or float
            (added to the scores)
        returns: [..., Hq, L, Ev] in query's dtype (a torch tensor when query is one)
    The leading dims of query, key and value are equal; Hq may differ from Hkv (a
    multiple of it) only with enable_gqa=True, as in PyTorch. is_causal hides keys after
    the query's position, top-left aligned when L != S (query i sees keys 0..i), and
    cannot be combined with attn_mask. scale defaults to 1/sqrt(E).

    Differences from PyTorch:
        - A row that a mask hides entirely gives zeros here; PyTorch gives NaN for such
          rows in some versions and backends (and zeros in others).
        - dropout_p other than 0.0 raises NotImplementedError: attn has no dropout.
        - The leading dims are not broadcast between query, key and value.
        - No autograd: a torch result does not track gradients (inputs are detached).
    """
    dropout_p = _arrays.number(dropout_p, "dropout_p")
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p: attn has no dropout; expected 0.0, given {dropout_p}"
        )
    q = _arrays.as_array(query, "query")
    k = _arrays.as_array(key, "key")
    v = _arrays.as_array(value, "value")
    is_causal = _arrays.flag(is_causal, "is_causal")
    enable_gqa = _arrays.flag(enable_gqa, "enable_gqa")
    rank = q.ndim
    if rank < 2:
        raise ValueError(f"query: expected at least 2 dims [..., L, E], given shape {_arrays.shape(q)}")
    for name, x in (("key", k), ("value", v)):
        if x.ndim != rank:
            raise ValueError(
                f"{name}: expected {rank} dims (as query), given shape {_arrays.shape(x)}"
            )
    lead = _arrays.shape(q)[:-2]
    batch_dims = lead[:-1]
    heads_q = lead[-1] if lead else 1
    k_lead, v_lead = _arrays.shape(k)[:-2], _arrays.shape(v)[:-2]
    expected_k = batch_dims + k_lead[-1:] if enable_gqa and lead else lead
    if k_lead != expected_k:
        what = "the leading dims of query" if not enable_gqa else "the batch dims of query"
        raise ValueError(
            f"key: expected leading dims {expected_k} ({what}; heads may differ only with "
            f"enable_gqa=True), given shape {_arrays.shape(k)}"
        )
    if v_lead != k_lead or _arrays.shape(v)[-2] != _arrays.shape(k)[-2]:
        raise ValueError(
            f"value: expected shape {k_lead + (_arrays.shape(k)[-2], 'Ev')} (leading dims and "
            f"length of key), given {_arrays.shape(v)}"
        )
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask: expected None when is_causal=True (as in PyTorch), given a mask")

    batch = math.prod(batch_dims)
    heads_kv = k_lead[-1] if k_lead else 1

    def to4(x, heads):
        length, dim = _arrays.shape(x)[-2:]
        return _arrays.readable(_arrays.reshape(x, (batch, heads, length, dim)))

    q4, k4, v4 = to4(q, heads_q), to4(k, heads_kv), to4(v, heads_kv)
    len_q, len_k, dim_v = _arrays.shape(q4)[2], _arrays.shape(k4)[2], _arrays.shape(v4)[3]
    out = _arrays.empty(q, lead + (len_q, dim_v), _arrays.dtype_name(q))

    mask4 = None
    if attn_mask is not None:
        m = _arrays.as_array(attn_mask, "attn_mask", allow_bool=True)
        given = _arrays.shape(m)
        wrong_shape = ValueError(
            f"attn_mask: expected a shape broadcastable to {lead + (len_q, len_k)}, given {given}"
        )
        if not 1 <= m.ndim <= rank:
            raise wrong_shape
        padded = (1,) * (rank - m.ndim) + given
        m = _arrays.reshape(m, padded)
        mask_batch_dims = padded[:-3] if rank >= 3 else ()
        mask_heads = padded[-3] if rank >= 3 else 1
        if mask_heads not in (1, heads_q) or padded[-2] not in (1, len_q) or padded[-1] not in (1, len_k):
            raise wrong_shape
        if any(d != 1 for d in mask_batch_dims):
            if any(d not in (1, b) for d, b in zip(mask_batch_dims, batch_dims)):
                raise wrong_shape
            m = _arrays.broadcast(m, batch_dims + padded[-3:])
            mask_batch = batch
        else:
            mask_batch = 1
        m4 = _arrays.reshape(m, (mask_batch, mask_heads) + padded[-2:])
        mask4 = _mask_view(m4, (batch, heads_q), len_q, len_k, "attn_mask")

    _run(q4, k4, v4, _arrays.reshape(out, (batch, heads_q, len_q, dim_v)), mask=mask4,
         scale=_arrays.number(scale, "scale", allow_none=True), causal=is_causal)
    return out
