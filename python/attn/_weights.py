"""attn.weights: the softmax weights attn.attention blends values with, for the same
keywords, without v; all of them, chosen heads or query rows, or the top k per row."""

import numpy as np

from . import _arrays, _request
from ._errors import ArgumentTypeError, Error
from ._attn import weights as _weights


def _chosen(values, name, count, what):
    """None, or a 1-D sequence of ints in [0, count), as a list of ints."""
    if values is None:
        return []
    array = np.asarray(values.detach().cpu().numpy() if _arrays.is_torch(values) else values)
    if array.ndim != 1 or array.size == 0:
        raise Error(f"{name}: expected a non-empty 1-D sequence of {what}, given shape {array.shape}")
    if array.dtype == object or array.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{name}: expected a sequence of ints, given dtype {array.dtype}")
    bad = (array < 0) | (array >= count)
    if bad.any():
        at = int(np.argmax(bad))
        raise Error(f"{name}: expected {what} in [0, {count}), given {int(array[at])} at position {at}")
    return [int(x) for x in array]


def weights(q, k, *, heads=None, rows=None, top_k=None, mask=None, layout="bhsd", **options):
    """The softmax weights alpha of attn.attention: exp(s_ij - lse_i), from the same fast
    kernel's scores and log-sum-exp, for the same keywords (which see), without v: the bits
    attn.attention(q, k, v, ..., return_weights=True) returns, for any v.

    Shapes (layout as in attn.attention; q and k have the same rank):
        q: [Lq, D] | [Hq, Lq, D] | [B, Hq, Lq, D]     k: [Lk, D] | [Hkv, Lk, D] | [B, Hkv, Lk, D]
        returns weights [B, heads, rows, Lk] without the leading dims q lacks, float32
        (float64 for float64 q); with top_k, (weights, indices), both [..., rows, top_k],
        indices int64.

    Selections (None means every one):
        heads: query heads, in the order given (repeats allowed).
        rows: query rows (packed sequences: rows of the packed q), in the order given.
        top_k: an int >= 1: the k largest weights of each row, largest first, ties broken
            by the lower key index, and their key indices (packed: into the packed k). A
            row that sees fewer than k keys is padded with index -1 and weight 0; a k
            above Lk is taken as Lk. The whole Lq x Lk matrix is never held.
    mask and layout as in attn.attention.

    A result that would not fit in the memory available raises MemoryError before
    anything is computed, saying how large it would be.

    Rows of a full selection sum to 1 less the sinks' share; a row that sees no key is all
    zeros. Bad input raises ValueError or TypeError naming the argument.
    """
    q, (k,), o, layout_view = _request.prepare(q, (("k", k),), layout, options, "weights")
    if top_k is not None:
        top_k = _arrays.integer(top_k, "top_k", "None or an int >= 1")
        if top_k < 1:
            raise Error(f"top_k: expected None or an int >= 1, given {top_k}")
    rank = q.ndim
    q4, k4 = layout_view(q), layout_view(k)
    batch, heads_q, len_q, _ = _arrays.shape(q4)
    len_k = _arrays.shape(k4)[2]
    head_list = _chosen(heads, "heads", heads_q, "query heads")
    row_list = _chosen(rows, "rows", len_q, "query rows")
    if top_k is not None:
        top_k = min(top_k, max(len_k, 1))  # more columns would hold only padding
    shape4 = (batch, len(head_list) or heads_q, len(row_list) or len_q,
              len_k if top_k is None else top_k)
    _arrays.check_memory(
        f"weights {list(shape4)}", shape4,
        np.dtype(_arrays.stats_dtype(q)).itemsize + (0 if top_k is None else 8),
        "select heads= or rows=, or ask for top_k (the largest weights of each row)")
    user_shape = shape4[4 - rank :]
    out = _arrays.empty(q, user_shape, _arrays.stats_dtype(q))
    indices = None if top_k is None else _arrays.empty(q, user_shape, "int64")

    ext = _request.ext
    _weights(
        ext(q4), ext(k4), out=_arrays.reshape(out, shape4),
        indices=None if indices is None else _arrays.reshape(indices, shape4),
        heads=head_list, rows=row_list, top_k=top_k,
        mask=ext(_request.mask_view(mask, (batch, heads_q), len_q, len_k)), options=o,
    )
    return out if indices is None else (out, indices)


weights.__doc__ += _request.OPTIONS_DOC
