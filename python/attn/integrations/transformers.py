"""attn as an attention implementation of Hugging Face transformers.

    import attn.integrations.transformers
    attn.integrations.transformers.register()
    model = AutoModel.from_pretrained(path, attn_implementation="attn")

register() adds attention_forward to transformers' AttentionInterface and, where the
installed transformers has an AttentionMaskInterface, its SDPA mask function (bool masks,
True = may attend, or None for plain causal), under the same name. Unlike transformers'
"sdpa", output_attentions=True works: the weights come from attn.attention.
"""

import transformers
import transformers.masking_utils

from .._attention import _refuse_gradients, attention

NAME = "attn"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, softcap=None, **kwargs):
    """transformers' attention function signature, computed by attn.attention.

    Shapes: query [B, Hq, L, D]  key [B, Hkv, S, D]  value [B, Hkv, S, Dv] (Hq a multiple
    of Hkv); attention_mask None or broadcastable to [B, Hq, L, S], bool (True = may attend)
    or float (added); returns (out [B, L, Hq, Dv], weights [B, Hq, L, S] in query's dtype
    when output_attentions=True, else None).
    is_causal (default module.is_causal) applies only without a mask and for L > 1, as in
    transformers' sdpa, which also drops keys past L then (an empty static cache).
    Training (inputs that require grad while autograd records) raises NotImplementedError:
    attn has no backward pass yet.
    """
    if dropout and module.training:
        raise NotImplementedError(f"dropout: attn has no dropout; expected 0.0, given {dropout}")
    _refuse_gradients((("query", query), ("key", key), ("value", value)))
    len_q = query.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(is_causal and attention_mask is None and len_q > 1)
    if is_causal and key.shape[2] > len_q:
        key, value = key[:, :, :len_q], value[:, :, :len_q]
    want_weights = bool(kwargs.get("output_attentions", False))
    result = attention(query, key, value, mask=attention_mask, causal=is_causal, scale=scaling,
                       softcap=softcap or 0.0, return_weights=want_weights)
    out, weights = result if want_weights else (result, None)
    if weights is not None:
        weights = weights.to(query.dtype)  # eager returns them in the query's dtype
    return out.transpose(1, 2).contiguous(), weights


def register(name=NAME):
    """Registers attention_forward (and the SDPA mask function) with transformers under
    name, so from_pretrained(..., attn_implementation=name) uses attn. Returns name."""
    transformers.AttentionInterface.register(name, attention_forward)
    mask_interface = getattr(transformers.masking_utils, "AttentionMaskInterface", None)
    if mask_interface is not None:
        mask_interface.register(name, transformers.masking_utils.sdpa_mask)
    return name
