"""The computation behind attn.attention (and its autograd node, attn/_backward.py): the
caller's arrays shaped into 4-D views, the outputs allocated in the caller's rank and
layout, and the extension's forward writing into them."""

import numpy as np

from . import _arrays, _request
from ._attn import forward as _forward


def attention(q, k, v, mask, layout, return_lse, return_weights, options, function="attention"):
    """out, or (out, lse, weights) holding those asked for; options: the caller's keywords."""
    q, (k, v), o, layout_view = _request.prepare(q, (("k", k), ("v", v)), layout, options,
                                                 function)
    return_lse = _arrays.flag(return_lse, "return_lse")
    return_weights = _arrays.flag(return_weights, "return_weights")
    rank = q.ndim
    q4, k4, v4 = (layout_view(x) for x in (q, k, v))
    batch, heads, len_q, _ = _arrays.shape(q4)
    len_k, dim_v = _arrays.shape(v4)[2], _arrays.shape(v4)[3]
    mask4 = _request.mask_view(mask, (batch, heads), len_q, len_k)

    out = _arrays.empty(q, _request.user_shape((batch, heads, len_q, dim_v), rank, layout),
                        _arrays.dtype_name(q))
    results = [out]
    lse4 = weights4 = None
    if return_lse:
        lse = _arrays.empty(q, (batch, heads, len_q)[4 - rank :], _arrays.stats_dtype(q))
        lse4 = _arrays.reshape(lse, (batch, heads, len_q, 1))
        results.append(lse)
    if return_weights:
        _arrays.check_memory(
            f"return_weights: the weights {[batch, heads, len_q, len_k]}",
            (batch, heads, len_q, len_k), np.dtype(_arrays.stats_dtype(q)).itemsize,
            "leave out return_weights, or use attn.weights with heads=, rows= or top_k")
        weights = _arrays.empty(q, (batch, heads, len_q, len_k)[4 - rank :], _arrays.stats_dtype(q))
        weights4 = _arrays.reshape(weights, (batch, heads, len_q, len_k))
        results.append(weights)
    ext = _request.ext
    _forward(ext(q4), ext(k4), ext(v4), out=ext(_request.to_bhsd(out, layout)), lse=ext(lse4),
             weights=ext(weights4), mask=ext(mask4), options=o)
    return out if len(results) == 1 else tuple(results)
