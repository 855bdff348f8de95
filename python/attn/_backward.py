"""attn.attention_backward (the gradients of attn.attention, for NumPy and torch alike) and
the torch.autograd.Function through which attn.attention and
attn.scaled_dot_product_attention take part in autograd."""

import functools

from . import _arrays, _forward, _request
from ._attn import backward as _backward
from ._errors import Error


def attention_backward(q, k, v, out, lse, dout, *, mask=None, layout="bhsd", **options):
    """The gradients of attn.attention(q, k, v, ...) = out with respect to q, k and v (and
    the sinks and the position bias table), given dout, the gradient of a loss with respect
    to out.

    q, k, v, mask, layout and every option are those the forward call was given; out and
    lse are what it returned (attn.attention(..., return_lse=True)), in its shapes and
    layout. dout has out's shape. The weights are recomputed from q, k and lse, never
    stored, so the extra memory is O(L x D) per head. No gradient flows into mask,
    alibi_slopes or scale. With GQA / MQA, dk and dv sum over the query heads of each group.

    Returns (dq, dk, dv) in the shapes and dtypes of q, k and v, then dsinks when sinks are
    given ([Hq], summed over batch and rows), then dposition_bias when position_bias is
    given (the table's shape, summed over batch, rows and keys); both float32 (float64 for
    float64 q). The results are the same bytes for any thread count. NumPy arrays in give
    NumPy arrays out, torch tensors give torch tensors.
    """
    q, (k, v, out, dout), o, layout_view = _request.prepare(
        q, (("k", k), ("v", v), ("out", out), ("dout", dout)), layout, options,
        "attention_backward")
    lse = _arrays.as_array(lse, "lse")
    if lse.ndim != q.ndim - 1:
        raise Error(f"lse: expected {q.ndim - 1} dims (q's, less the last), given shape "
                    f"{_arrays.shape(lse)}")
    q4, k4, v4, out4, dout4 = (layout_view(x) for x in (q, k, v, out, dout))
    lse4 = _arrays.readable(_arrays.reshape(lse, (1,) * (3 - lse.ndim) + _arrays.shape(lse) + (1,)))
    batch, heads, len_q, _ = _arrays.shape(q4)
    len_k = _arrays.shape(k4)[2]

    grads = [_arrays.empty(x, _arrays.shape(x), _arrays.dtype_name(x)) for x in (q, k, v)]
    dsinks = dsinks4 = None
    if o.sinks:
        dsinks = _arrays.empty(q, (heads,), _arrays.stats_dtype(q))
        dsinks4 = _arrays.reshape(dsinks, (1, heads, 1, 1))
    dbias = dbias4 = None
    if o.has_position_bias:
        bias = options["position_bias"]
        dbias = _arrays.empty(q, bias.shape, _arrays.stats_dtype(q))
        rows = 1 if len(bias.shape) == 1 else bias.shape[0]
        dbias4 = _arrays.reshape(dbias, (1, rows, 1, bias.columns))
    dq4, dk4, dv4 = (_request.to_bhsd(g, layout) for g in grads)
    ext = _request.ext
    _backward(
        ext(q4), ext(k4), ext(v4), ext(out4), ext(lse4), ext(dout4),
        dq=ext(dq4), dk=ext(dk4), dv=ext(dv4), dsinks=ext(dsinks4), dposition_bias=ext(dbias4),
        mask=ext(_request.mask_view(mask, (batch, heads), len_q, len_k)), options=o,
    )
    return (*grads, *(x for x in (dsinks, dbias) if x is not None))


attention_backward.__doc__ += _request.OPTIONS_DOC


def _bhsd(x, layout):
    """A torch tensor of attn.attention's shapes ([L, D], [H, L, D] or [B, H, L, D] in
    layout) as a [B, H, L, D] view."""
    if layout == "bshd" and x.dim() >= 3:
        x = x.transpose(-3, -2)
    return x.reshape((1,) * (4 - x.dim()) + tuple(x.shape))


def mask_gradient(q, k, v, out, dout, mask, layout, options):
    """The gradient of a float mask (added to the scores): dS = P (z dP - rowsum(dO O)),
    dP = dO V^T, summed over the dims the mask broadcasts over; z is dropout's factor (1
    without dropout). P comes from attn.weights (the forward's own weights) one query head at
    a time, so beside the mask's own size at most [B, Lq, Lk] more is held (with dropout, its
    [B, Hq, Lq, Lk] booleans too)."""
    from ._dropout import dropout_mask
    from ._weights import weights

    torch = _arrays._torch()
    q4, k4, v4, out4, dout4 = (_bhsd(x.detach(), layout) for x in (q, k, v, out, dout))
    batch, heads, len_q, _ = q4.shape
    group, len_k = heads // k4.shape[1], k4.shape[2]
    shape4 = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    dmask = torch.zeros(shape4, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    delta = (dout4.to(dmask.dtype) * out4.to(dmask.dtype)).sum(-1, keepdim=True)
    dropout_p = options.get("dropout_p", 0.0)
    if dropout_p:
        kept = torch.from_numpy(dropout_mask((batch, heads, len_q, len_k), dropout_p,
                                             options["dropout_seed"]))
    for h in range(heads):
        p = weights(q.detach(), k.detach(), heads=[h], mask=mask.detach(), layout=layout,
                    **options).reshape(batch, len_q, len_k)
        dp = dout4[:, h].to(dmask.dtype) @ v4[:, h // group].to(dmask.dtype).transpose(-1, -2)
        if dropout_p:
            dp = torch.where(kept[:, h], dp / (1.0 - dropout_p), 0.0)
        ds = p * (dp - delta[:, h])
        for axis, size in ((0, shape4[0]), (1, shape4[2]), (2, shape4[3])):
            if size == 1:
                ds = ds.sum(axis, keepdim=True)
        dmask[:, h if shape4[1] == heads else 0] += ds
    return dmask.reshape(mask.shape).to(mask.dtype)


@functools.cache
def _attention_function():
    """The autograd Function, made on first use (torch is optional)."""
    torch = _arrays._torch()

    class AttentionFunction(torch.autograd.Function):
        """attn.attention as one autograd node: forward saves q, k, v, out and lse (and the
        sinks), backward calls attention_backward (and mask_gradient). bias_table: the
        position bias's table, an input here so that autograd gives it its gradient."""

        @staticmethod
        def forward(ctx, q, k, v, sinks, mask, layout, keywords, return_weights, bias_table):
            results = _forward.attention(q, k, v, mask, layout, True, return_weights,
                                         dict(keywords, sinks=sinks))
            sinks_tensor = sinks if _arrays.is_torch(sinks) else None
            ctx.bias_is_tensor = _arrays.is_torch(bias_table)
            ctx.save_for_backward(q, k, v, results[0], results[1], sinks_tensor)
            ctx.mark_non_differentiable(*results[1:])
            ctx.mask, ctx.layout, ctx.keywords = mask, layout, keywords
            ctx.sinks = None if sinks_tensor is not None else sinks  # a list, or None
            return results

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, dout, *_):
            q, k, v, out, lse, sinks_tensor = ctx.saved_tensors
            sinks = ctx.sinks if sinks_tensor is None else sinks_tensor
            grads = attention_backward(q, k, v, out, lse, dout, mask=ctx.mask, layout=ctx.layout,
                                       sinks=sinks, **ctx.keywords)
            dsinks = dmask = dtable = None
            if sinks_tensor is not None and ctx.needs_input_grad[3]:
                dsinks = grads[3].to(sinks_tensor.dtype).reshape(sinks_tensor.shape)
            if ctx.needs_input_grad[4]:
                dmask = mask_gradient(q, k, v, out, dout, ctx.mask, ctx.layout,
                                      dict(ctx.keywords, sinks=sinks))
            if ctx.bias_is_tensor and ctx.needs_input_grad[8]:
                table = ctx.keywords["position_bias"].table
                dtable = grads[-1].to(table.dtype)
            return grads[0], grads[1], grads[2], dsinks, dmask, None, None, None, dtable

    return AttentionFunction


def attention_with_gradients(q, k, v, mask, layout, return_lse, return_weights, options):
    """attn.attention recorded by autograd: its out has a grad_fn whose backward is
    attention_backward (and mask_gradient for a float mask that requires grad); lse and
    weights, when asked for, carry no gradient."""
    _arrays.refuse_gradients(options.get("alibi_slopes"), "alibi_slopes")
    return_lse = _arrays.flag(return_lse, "return_lse")
    keywords = {name: value for name, value in options.items() if name != "sinks"}
    bias = options.get("position_bias")
    results = _attention_function().apply(q, k, v, options.get("sinks"), mask, layout, keywords,
                                           return_weights, getattr(bias, "table", None))
    kept = [results[0]] + ([results[1]] if return_lse else []) + list(results[2:])
    return kept[0] if len(kept) == 1 else tuple(kept)
