"""attn.contributions: how much each input adds to each query's context vector, beyond its
weight: alpha_ij ||v_j||, or alpha_ij ||v_j W_O^h|| with an output projection (Kobayashi et
al., EMNLP 2020, "Attention is not only a weight")."""

from . import _arrays, _request
from ._attn import contributions as _contributions
from ._errors import Error
from ._weights import _chosen


def contributions(q, k, v, *, output_projection=None, heads=None, rows=None, mask=None,
                  layout="bhsd", **options):
    """The norm of each input's share of each query's context, alpha_ij v_j: attn.weights
    (the same fused kernel and bits) times ||v_j||, or times ||v_j W_O^h|| for query head h
    with output_projection. No Lq x Lk x Dv array is formed; the norms are float64 and each
    product is rounded once. A large weight on a small value vector contributes little.

    Shapes (layout as in attn.attention; q, k and v have the same rank):
        q: [..., Hq, Lq, D]  k: [..., Hkv, Lk, D]  v: [..., Hkv, Lk, Dv]
        output_projection: None, or [Hq, Dv, E]: W_O by query head (a torch layer's
            out_proj.weight [E, Hq * Dv] is weight.T.reshape(Hq, Dv, E))
        returns [B, heads, rows, Lk] without the leading dims q lacks, float32 (float64
        for float64 q).
    heads, rows, mask and the options as in attn.weights (no top_k). Bad input raises
    ValueError or TypeError naming the argument.
    """
    q, (k, v), o, layout_view = _request.prepare(
        q, (("k", k), ("v", v)), layout, options, "contributions")
    rank = q.ndim
    q4, k4, v4 = layout_view(q), layout_view(k), layout_view(v)
    batch, heads_q, len_q, _ = _arrays.shape(q4)
    len_k = _arrays.shape(k4)[2]
    projection = None
    if output_projection is not None:
        projection = _arrays.as_array(output_projection, "output_projection")
        if projection.ndim != 3:
            raise Error(f"output_projection: expected 3 dims [Hq, Dv, E], given shape "
                        f"{_arrays.shape(projection)}")
        projection = _arrays.reshape(projection, (1,) + _arrays.shape(projection))
    ext = _request.ext
    out = _contributions(
        ext(q4), ext(k4), ext(v4), heads=_chosen(heads, "heads", heads_q, "query heads"),
        rows=_chosen(rows, "rows", len_q, "query rows"), output_projection=ext(projection),
        mask=ext(_request.mask_view(mask, (batch, heads_q), len_q, len_k)), options=o)
    shape4 = _arrays.shape(out)
    return _arrays.like_kind(_arrays.reshape(out, shape4[4 - rank:]), q)


contributions.__doc__ += _request.OPTIONS_DOC
