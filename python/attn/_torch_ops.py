"""attn.scaled_dot_product_attention as torch.library custom ops, attn::sdpa,
attn::sdpa_backward and attn::sdpa_mask_backward (a float mask's gradient), with fake
kernels and registered autograd: what torch.compile (fullgraph=True), torch.export and meta
tensors need to take attn without a graph break.

Eager calls keep the direct path (_attention.py); a call that torch is tracing (compiling
or exporting), or whose inputs are meta tensors, goes through the ops, which run the same
kernels: attn.attention forward, attn.attention_backward and mask_gradient for the
gradients."""

from typing import Optional

from . import _arrays


def traced(tensors):
    """Whether a call on these arguments must go through the ops: torch is tracing it, or
    an input is a meta (or fake) tensor, which no kernel can read. Outside a trace, it makes
    sure the ops exist, so that the next trace finds them."""
    if not any(_arrays.is_torch(x) for x in tensors):
        return False
    if _arrays._torch().compiler.is_compiling():
        return True
    register()
    return any(_arrays.is_torch(x) and x.device.type == "meta" for x in tensors)


def torch_imported():
    return _arrays._torch() is not None


_sdpa = None  # attn::sdpa once register() has made it


def register():
    """Registers the ops with torch once (attn's import does it when torch is already
    imported, else the first call with torch tensors). Not traceable: never call it from a
    function torch is compiling."""
    global _sdpa
    if _sdpa is None:
        _sdpa = _make_ops()
    return _sdpa


def _make_ops():
    torch = _arrays._torch()
    from ._attention import attention
    from ._backward import attention_backward, mask_gradient
    Tensor = torch.Tensor

    def align(bottom_right):
        return "bottom-right" if bottom_right else "top-left"

    def lse_dtype(query):
        return torch.float64 if query.dtype == torch.float64 else torch.float32

    def dropout(dropout_p, dropout_seed):
        """attn's dropout keywords: the seed, a 0-d int64 tensor drawn in the graph, as an int."""
        if not dropout_p:
            return {}
        return {"dropout_p": dropout_p, "dropout_seed": int(dropout_seed)}

    @torch.library.custom_op("attn::sdpa", mutates_args=())
    def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
             is_causal: bool, bottom_right: bool, scale: Optional[float], dropout_p: float,
             dropout_seed: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] (Hkv divides Hq)
        -> (out [B, Hq, L, Ev], lse [B, Hq, L])."""
        with torch.no_grad():
            return attention(query, key, value, mask=attn_mask, causal=is_causal, scale=scale,
                             causal_align=align(bottom_right), return_lse=True,
                             **dropout(dropout_p, dropout_seed))

    @sdpa.register_fake
    def _(query, key, value, attn_mask, is_causal, bottom_right, scale, dropout_p, dropout_seed):
        out = query.new_empty(query.shape[:-1] + (value.shape[-1],))
        return out, query.new_empty(query.shape[:-1], dtype=lse_dtype(query))

    @torch.library.custom_op("attn::sdpa_backward", mutates_args=())
    def sdpa_backward(dout: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor,
                      lse: Tensor, attn_mask: Optional[Tensor], is_causal: bool,
                      bottom_right: bool, scale: Optional[float], dropout_p: float,
                      dropout_seed: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """The gradients of attn::sdpa's out with respect to query, key and value."""
        return attention_backward(query, key, value, out, lse, dout, mask=attn_mask,
                                  causal=is_causal, causal_align=align(bottom_right), scale=scale,
                                  **dropout(dropout_p, dropout_seed))

    @sdpa_backward.register_fake
    def _(dout, query, key, value, out, lse, attn_mask, is_causal, bottom_right, scale, dropout_p,
          dropout_seed):
        return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)

    @torch.library.custom_op("attn::sdpa_mask_backward", mutates_args=())
    def sdpa_mask_backward(dout: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor,
                           attn_mask: Tensor, is_causal: bool, bottom_right: bool,
                           scale: Optional[float], dropout_p: float,
                           dropout_seed: Optional[Tensor]) -> Tensor:
        """The gradient of attn::sdpa's out with respect to a float attn_mask."""
        return mask_gradient(query, key, value, out, dout, attn_mask, "bhsd",
                             {"causal": is_causal, "causal_align": align(bottom_right),
                              "scale": scale, **dropout(dropout_p, dropout_seed)})

    @sdpa_mask_backward.register_fake
    def _(dout, query, key, value, out, attn_mask, is_causal, bottom_right, scale, dropout_p,
          dropout_seed):
        return torch.empty_like(attn_mask)

    def setup_context(ctx, inputs, output):
        query, key, value, attn_mask, is_causal, bottom_right, scale, dropout_p, seed = inputs
        ctx.save_for_backward(query, key, value, output[0], output[1], attn_mask, seed)
        ctx.is_causal, ctx.bottom_right, ctx.scale = is_causal, bottom_right, scale
        ctx.dropout_p = dropout_p
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, dout, _dlse):
        query, key, value, out, lse, attn_mask, seed = ctx.saved_tensors
        dout = dout.contiguous()
        options = (ctx.is_causal, ctx.bottom_right, ctx.scale, ctx.dropout_p, seed)
        grads = sdpa_backward(dout, query, key, value, out, lse, attn_mask, *options)
        dmask = None
        if ctx.needs_input_grad[3]:
            dmask = sdpa_mask_backward(dout, query, key, value, out, attn_mask, *options)
        return (*grads, dmask, None, None, None, None, None)

    sdpa.register_autograd(backward, setup_context=setup_context)
    return sdpa


def scaled_dot_product_attention(query, key, value, attn_mask, is_causal, bottom_right, scale,
                                 enable_gqa, dropout_p):
    """attn::sdpa for 4-D query, key and value of one batch size (the shapes transformers and
    most models give), its out alone, as torch's SDPA returns it. With dropout, the seed is
    drawn in the graph from torch's generator (so a compiled graph draws a new one per call)."""
    from ._errors import Error

    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() != 4 or x.shape[0] != query.shape[0]:
            raise Error(f"{name}: expected 4 dims [B, H, L, E] with query's B when torch traces "
                        f"attn (torch.compile, export, meta tensors), given shape "
                        f"{tuple(x.shape)}")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise Error(f"key: expected query's {query.shape[1]} heads, or enable_gqa=True, given "
                    f"{key.shape[1]}")
    if _sdpa is None:
        raise Error("attn: expected attn's torch ops to be registered before torch traces it; "
                    "import torch before attn, or call attn._torch_ops.register() first")
    if _arrays.is_torch(scale):
        scale = float(scale)
    torch = _arrays._torch()
    seed = torch.randint(2**62, (), dtype=torch.int64) if dropout_p else None
    return torch.ops.attn.sdpa(query, key, value, attn_mask, bool(is_causal), bool(bottom_right),
                               scale, float(dropout_p), seed)[0]
