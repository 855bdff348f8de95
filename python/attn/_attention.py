"""attn.attention (FlashAttention-style keywords) and attn.scaled_dot_product_attention
(PyTorch's signature): both shape the caller's arrays into 4-D [B, H, S, D] views, allocate
the outputs, and let the extension write into them (attn/_forward.py, attn/_request.py)."""

import math
import sys

import numpy as np

from . import _arrays, _forward, _request, _torch_ops
from ._attn import describe_view as _describe_view
from ._attn import explain as _explain
from ._attn import forward as _extension_forward
from ._backward import attention_with_gradients
from ._errors import ArgumentTypeError, Error


def describe_input(x, layout="bhsd"):
    """What the kernels see of x when attention() receives it: a dict with the address,
    dtype, [B, H, L, D] shape and element strides. For checking that inputs are read in
    place (the address is the caller's) or were copied."""
    array = _arrays.as_array(x, "x", detach=True)
    return _describe_view(_arrays.for_extension(_request.input_view(array, layout)), "x")


def attention(q, k, v, *, mask=None, layout="bhsd", return_lse=False, return_weights=False,
              **options):
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

    Keywords:
        mask: bool (True = may attend, as in PyTorch) or float (added to the score; -inf
            hides the key), broadcastable to [B, Hq, Lq, Lk] with the same leading-dim
            rules as NumPy.
        layout: "bhsd" or "bshd" (see Shapes).
        return_lse, return_weights: also return lse (log-sum-exp of each row's visible
            scores, sinks included) and the softmax weights, in that order. The weights are
            attn.weights' for the same arguments, bit for bit.
    {options}
    A row that sees no key gives zeros (and lse = -inf), never NaN. The GIL is released
    while the kernel runs. Bad input raises ValueError or TypeError naming the argument.
    float64 inputs run attn's float64 reference, far slower, which attn.explain says
    before a call and a FallbackWarning once.

    Autograd: when q, k, v, sinks or a position bias's table are torch tensors that require
    grad while gradients are recorded, out has a grad_fn whose backward is
    attn.attention_backward (lse and weights carry no gradient; a float mask that requires
    grad gets its gradient, the scores' dS summed over the dims it broadcasts over;
    alibi_slopes that requires grad is refused).

    Returns out, or a tuple (out, lse, weights) holding the ones asked for.
    """
    options = _request.draw_dropout_seed(options, q)  # one seed for forward and backward
    bias_table = getattr(options.get("position_bias"), "table", None)
    if _arrays.records_gradients(q, k, v, options.get("sinks"), mask, bias_table):
        return attention_with_gradients(q, k, v, mask, layout, return_lse, return_weights,
                                        options)
    return _forward.attention(q, k, v, mask, layout, return_lse, return_weights, options)


attention.__doc__ = attention.__doc__.replace("    {options}\n", _request.OPTIONS_DOC.lstrip("\n"))


def explain(q, k, v, *, mask=None, layout="bhsd", **options):
    """Which backend attn.attention(q, k, v, ...) runs with these arguments, and why, without
    running it: a dict with
        backend: "fast" (attn's CPU kernels) or "reference" (its float64 oracle);
        reason: why the reference (what the fast kernels lack, e.g. float64 inputs, or that
            it was asked for); empty for the fast kernels;
        plan: the fast kernels' plan on this CPU (the kernel that scores wide and narrow
            row chunks, the context path); empty for the reference.
    For attn.weights(q, k, ...), pass k as v. Arguments are checked as attn.attention
    checks them."""
    q, (k, v), o, layout_view = _request.prepare(q, (("k", k), ("v", v)), layout, options,
                                                 "explain")
    q4, k4, v4 = (layout_view(x) for x in (q, k, v))
    batch, heads, len_q, _ = _arrays.shape(q4)
    mask4 = _request.mask_view(mask, (batch, heads), len_q, _arrays.shape(k4)[2])
    ext = _request.ext
    return _explain(ext(q4), ext(k4), ext(v4), mask=ext(mask4), options=o)


def _causal_bias(mask):
    """(bottom_right, (L, S)) for torch.nn.attention.bias.causal_upper_left(L, S) or
    causal_lower_right(L, S), else None."""
    bias = sys.modules.get("torch.nn.attention.bias")
    if bias is None or not isinstance(mask, bias.CausalBias):
        return None
    return mask.variant == bias.CausalVariant.LOWER_RIGHT, (mask.seq_len_q, mask.seq_len_kv)


def _autocast(arrays):
    """Inside torch.autocast("cpu", dtype), PyTorch computes attention in that dtype: its
    floating inputs other than float64 are cast to it, and so is the result."""
    torch = _arrays._torch()
    if torch is None or not torch.is_autocast_enabled("cpu"):
        return arrays
    low = torch.get_autocast_dtype("cpu")

    def cast(x):
        eligible = _arrays.is_torch(x) and x.is_floating_point() and x.dtype != torch.float64
        return x.to(low) if eligible else x

    return [cast(x) for x in arrays]


def _broadcast_leads(leads, names, what):
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*leads))
    except ValueError:
        given = ", ".join(f"{n} {lead}" for n, lead in zip(names, leads))
        raise Error(f"{', '.join(names)}: expected {what} that broadcast together, given {given}") from None


def _sdpa_shapes(q, k, v, enable_gqa):
    """The output's leading dims and the [B, Hq] / [B, Hkv] shapes q, k and v are expanded to,
    following PyTorch: leading dims broadcast as in matmul; with enable_gqa and 3 or more
    dims, Hq is a multiple of Hkv and only the dims before the heads broadcast."""
    lead_q, lead_k, lead_v = (_arrays.shape(x)[:-2] for x in (q, k, v))
    if _arrays.shape(k)[-2] != _arrays.shape(v)[-2]:
        raise Error(f"value: expected the length S of key ({_arrays.shape(k)[-2]}), given shape "
                    f"{_arrays.shape(v)}")
    if enable_gqa and lead_q and lead_k and lead_v:
        heads_q, heads_k, heads_v = lead_q[-1], lead_k[-1], lead_v[-1]
        if heads_k != heads_v or heads_k == 0 or heads_q % heads_k:
            raise Error(
                f"key, value: expected the same number of heads, dividing query's {heads_q} "
                f"(enable_gqa=True), given key {_arrays.shape(k)} and value {_arrays.shape(v)}")
        batch = _broadcast_leads((lead_q[:-1], lead_k[:-1], lead_v[:-1]),
                                 ("query", "key", "value"), "batch dims (before the heads)")
        return batch + (heads_q,), batch + (heads_k,)
    lead = _broadcast_leads((lead_q, lead_k, lead_v), ("query", "key", "value"),
                            "leading dims (heads may differ only with enable_gqa=True)")
    return lead, lead


def _sdpa_mask(attn_mask, q, lead, len_q, len_k, records):
    """attn_mask broadcastable to lead + [L, S] -> a [B or 1, Hq or 1, L, S] view (of the
    tensor autograd follows when records)."""
    m = _arrays.as_array(attn_mask, "attn_mask", allow_bool=True, detach=records)
    mask_dtype, q_dtype = _arrays.dtype_name(m), _arrays.dtype_name(q)
    if mask_dtype not in ("bool", "float32", q_dtype):
        raise ArgumentTypeError(
            f"attn_mask: expected dtype bool, float32 or query's {q_dtype} (as PyTorch), "
            f"given {mask_dtype}")
    given = _arrays.shape(m)
    full = lead + (len_q, len_k)
    if not 2 <= m.ndim <= len(full) or any(d not in (1, f) for d, f in zip(given[::-1], full[::-1])):
        raise Error(f"attn_mask: expected 2 or more dims broadcastable to {full}, given {given}")
    batch_dims, heads = lead[:-1], (lead[-1] if lead else 1)
    padded = (1,) * (len(full) - m.ndim) + given
    m = _arrays.reshape(attn_mask if records else m, padded)
    mask_heads = padded[-3] if lead else 1
    if any(d != 1 for d in padded[:-3]):
        m = _arrays.broadcast(m, batch_dims + padded[-3:])
        mask_batch = math.prod(batch_dims)
    else:
        mask_batch = 1
    m4 = _arrays.reshape(m, (mask_batch, mask_heads) + padded[-2:])
    return _request.broadcast_mask(m4, (math.prod(batch_dims), heads), len_q, len_k, "attn_mask")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, computed by attn.

    Shapes, as in PyTorch:
        query: [..., Hq, L, E]   key: [..., Hkv, S, E]   value: [..., Hkv, S, Ev]
        attn_mask: broadcastable to [..., Hq, L, S]; bool (True = may attend) or float
            (added to the scores), or torch.nn.attention.bias.causal_upper_left(L, S) /
            causal_lower_right(L, S)
        returns: [..., Hq, L, Ev] in query's dtype (a torch tensor when query is one), its
            memory in the order of query's (a [B, L, H, E] query gives [B, L, H, Ev] memory)
    The leading dims of query, key and value broadcast against each other (as in matmul);
    with enable_gqa=True, Hkv may instead divide Hq (grouped-query attention). is_causal
    hides keys after the query's position, top-left aligned when L != S (query i sees keys
    0..i), and cannot be combined with attn_mask; causal_lower_right aligns bottom-right
    (query i sees keys 0..i + S - L). scale (a number or a 0-d tensor) defaults to
    1/sqrt(E). Inside torch.autocast("cpu", dtype) floating inputs other than float64 are
    computed in that dtype, as PyTorch does. E = 0 gives every visible key the same weight;
    S = 0 gives zeros.

    Refused as PyTorch refuses them: query, key and value of different dtypes; a float
    attn_mask other than float32 or query's dtype; a 1-D attn_mask. Errors are attn.Error /
    attn.ArgumentTypeError, which are RuntimeErrors as PyTorch's are.

    Autograd: when query, key or value require grad while gradients are recorded, the
    result has a grad_fn (attn.attention_backward computes the gradients; broadcast
    leading dims sum theirs back). A float attn_mask that requires grad gets its gradient
    (the scores' dS, summed over the dims it broadcasts over), as in PyTorch.

    torch.compile, torch.export and meta tensors: a call that torch traces (or on meta
    tensors) goes through the custom ops torch.ops.attn.sdpa, sdpa_backward and
    sdpa_mask_backward, which
    have fake kernels and registered autograd, so torch.compile(fullgraph=True) takes it
    without a graph break; such a call needs 4-D query, key and value of one batch size.
    attn registers the ops at import when torch is imported first, else at its first call
    with torch tensors.

    dropout_p > 0 drops weights as PyTorch does (whatever the module's training flag: a
    model passes 0.0 in eval), from a seed drawn from torch's default generator, so
    torch.manual_seed repeats it; which weights attn drops differs from PyTorch's (their
    generators differ), not how often (attn.attention's dropout_p and dropout_seed).

    Differences from PyTorch:
        - A NaN in query gives NaN in that output row here (PyTorch's CPU kernel may give
          zeros); a row that a mask hides entirely gives zeros in both.
        - torch tensor subclasses other than the causal biases and nn.Parameter are
          refused, not interpreted.
    """
    dropout_p = _arrays.number(dropout_p, "dropout_p")
    is_causal = _arrays.flag(is_causal, "is_causal")
    enable_gqa = _arrays.flag(enable_gqa, "enable_gqa")
    if is_causal and attn_mask is not None:
        raise Error("attn_mask: expected None when is_causal=True (as in PyTorch), given a mask")
    bottom_right = False
    causal_bias = _causal_bias(attn_mask)
    if causal_bias is not None:
        bottom_right, bias_lengths = causal_bias
        is_causal, attn_mask = True, None
    if _torch_ops.traced((query, key, value, attn_mask)):
        return _torch_ops.scaled_dot_product_attention(query, key, value, attn_mask, is_causal,
                                                       bottom_right, scale, enable_gqa,
                                                       dropout_p)
    records = _arrays.records_gradients(query, key, value, attn_mask)
    query, key, value, attn_mask = _autocast([query, key, value, attn_mask])
    q = _arrays.as_array(query, "query", detach=records)
    k = _arrays.as_array(key, "key", detach=records)
    v = _arrays.as_array(value, "value", detach=records)
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.ndim < 2:
            raise Error(f"{name}: expected at least 2 dims [..., L, E], given shape {_arrays.shape(x)}")
    dtypes = [_arrays.dtype_name(x) for x in (q, k, v)]
    if len(set(dtypes)) > 1:
        raise ArgumentTypeError(
            f"key, value: expected query's dtype (as PyTorch), given query {dtypes[0]}, "
            f"key {dtypes[1]} and value {dtypes[2]}")
    len_q, dim = _arrays.shape(q)[-2:]
    len_k, dim_k = _arrays.shape(k)[-2:]
    dim_v = _arrays.shape(v)[-1]
    if dim_k != dim:
        raise Error(f"key: expected E = {dim} (query's last dim), given shape {_arrays.shape(k)}")
    if causal_bias is not None and bias_lengths != (len_q, len_k):
        raise Error(f"attn_mask: expected a causal bias for (L, S) = {(len_q, len_k)}, given one "
                    f"for {bias_lengths}")
    lead, lead_kv = _sdpa_shapes(q, k, v, enable_gqa)
    batch = math.prod(lead[:-1])
    heads_q, heads_kv = (lead[-1], lead_kv[-1]) if lead else (1, 1)

    def to4(x, x_lead, heads):
        length, last = _arrays.shape(x)[-2:]
        full = _arrays.broadcast(x, x_lead + (length, last))
        return _arrays.readable(_arrays.reshape(full, (batch, heads, length, last)))

    if records:  # the same views of the tensors autograd follows (broadcasts sum back)
        q, k, v = query, key, value
    q4, k4, v4 = to4(q, lead, heads_q), to4(k, lead_kv, heads_kv), to4(v, lead_kv, heads_kv)
    out4 = _arrays.empty_in_layout(q4, (batch, heads_q, len_q, dim_v), dtypes[0])
    out = _arrays.reshape(out4, lead + (len_q, dim_v))  # splits B: a view of out4
    mask4 = None if attn_mask is None else _sdpa_mask(attn_mask, q, lead, len_q, len_k, records)
    scale = _arrays.number(scale, "scale", allow_none=True)
    if _arrays.shape(out4).count(0) or len_k == 0:
        if records:  # zeros whose gradient is zeros (an empty sum reads no value)
            out = out.detach().zero_() + sum(x[..., :0].sum() for x in (query, key, value))
        else:
            out[...] = 0  # no output, or no key to attend to: zeros, as PyTorch
        return out
    if dim == 0:  # every score is 0 (PyTorch's too, whatever the scale): uniform weights
        q4, k4 = (_arrays.zeros(x, _arrays.shape(x)[:3] + (1,), dtypes[0]) for x in (q4, k4))
        scale = 1.0
    keywords = _request.draw_dropout_seed(
        {"scale": scale, "causal": is_causal, "dropout_p": dropout_p,
         "causal_align": "bottom-right" if bottom_right else "top-left"}, query)
    if records:
        out4.copy_(attention(q4, k4, v4, mask=mask4, **keywords))
        return out4.reshape(lead + (len_q, dim_v))
    options = _request.options(query, keywords, "scaled_dot_product_attention")
    ext = _request.ext
    _extension_forward(ext(q4), ext(k4), ext(v4), out=ext(out4), lse=None, weights=None,
                       mask=ext(mask4), options=options)
    return out
