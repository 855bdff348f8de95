"""attn as an attention implementation of Hugging Face transformers.

    import attn.integrations.transformers
    attn.integrations.transformers.register()
    model = AutoModel.from_pretrained(path, attn_implementation="attn")

register() adds attention_forward to transformers' AttentionInterface and, where the
installed transformers has an AttentionMaskInterface, its SDPA mask function (bool masks,
True = may attend, or None for plain causal), under the same name. Unlike transformers'
"sdpa", output_attentions=True works: the weights come from attn.attention.

draw_model(model, tokenizer, text, "model.html") runs the model once on a text with attn's
weights and draws every layer and head of it into one self-contained HTML page.
"""

import os

import torch
import transformers
import transformers.masking_utils

from .. import viz
from .. import _torch_ops
from .._attention import attention, scaled_dot_product_attention
from .._errors import ArgumentTypeError, Error

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
    Training works: inputs that require grad give an out with a grad_fn (attn's backward
    pass); the mask gets no gradient; dropout applies while module.training, its seed drawn
    from torch's generator. Under torch.compile and torch.export (no weights, no
    softcap) it goes through the custom op attn::sdpa, so a model compiles whole.
    """
    dropout_p = float(dropout) if module.training else 0.0
    len_q = query.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(is_causal and attention_mask is None and len_q > 1)
    if is_causal and key.shape[2] > len_q:
        key, value = key[:, :, :len_q], value[:, :, :len_q]
    want_weights = bool(kwargs.get("output_attentions", False))
    if not want_weights and not softcap and _torch_ops.traced((query, key, value, attention_mask)):
        # Under torch.compile or torch.export: the custom op attn::sdpa, the same kernels.
        out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                           dropout_p=dropout_p, is_causal=is_causal,
                                           scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    result = attention(query, key, value, mask=attention_mask, causal=is_causal, scale=scaling,
                       softcap=softcap or 0.0, dropout_p=dropout_p,
                       return_weights=want_weights)
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


def _model_name(model):
    """The hub id the model was loaded from, or its class name when it came from a local
    folder (whose name, a snapshot hash or "model", says little)."""
    name = str(getattr(model.config, "name_or_path", "") or "")
    return name if name and not os.path.isdir(name) else type(model).__name__


def draw_model(model, tokenizer, text, path, title=None):
    """Run `model` once on `text` with attn's attention weights and draw every layer and
    head into one self-contained HTML page at `path` (attn.viz.model): a layer x head grid,
    the chosen head large with the tokens on both axes, a head view, the mean over heads, a
    shared or per-head colour scale, a toggle that hides the tokenizer's special tokens
    ([CLS], [SEP], ...; each shown row renormalised over the shown keys), and a choice of
    the weights, each input's contribution alpha_ij ||v_j|| (the value vectors recorded in
    the same run) or the attention rollout through the layers.

    The weights are attn's own (output_attentions=True through attention_forward, never
    transformers' eager path): a model loaded with another attn_implementation is switched
    to attn for this one run and switched back. The page appears whole or not at all.
    model: a transformers PreTrainedModel whose output has .attentions (encoders such as
        BERT, decoders such as Llama); tokenizer: its tokenizer; text: a str.
    path: ending in .html or .htm.  title: None names the model and the text.
    Returns the weights drawn: a tuple with one [1, H, L, L] tensor per layer.
    """
    if not isinstance(model, transformers.PreTrainedModel):
        raise ArgumentTypeError(
            f"model: expected a transformers PreTrainedModel, given {type(model).__name__}")
    if not callable(tokenizer) or not hasattr(tokenizer, "convert_ids_to_tokens"):
        raise ArgumentTypeError(
            f"tokenizer: expected a transformers tokenizer, given {type(tokenizer).__name__}")
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text: expected a str, given {type(text).__name__}")
    if not text.strip():
        raise Error("text: expected some text to tokenize, given an empty str")
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"path: expected a str or os.PathLike, given {type(path).__name__}")
    if not os.fspath(path).lower().endswith((".html", ".htm")):
        raise Error(f"path: expected a file name ending in .html or .htm, given {os.fspath(path)!r}")
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(f"title: expected a str or None, given {type(title).__name__}")

    name = register()
    norms = []  # per layer, each KV head's value norms [Hkv, S], for the contributions

    def recording(module, query, key, value, *args, **kwargs):
        norms.append(value[0].detach().double().norm(dim=-1))
        return attention_forward(module, query, key, value, *args, **kwargs)

    transformers.AttentionInterface.register(name, recording)
    before = model.config._attn_implementation
    if before != name:
        model.set_attn_implementation(name)
        if model.config._attn_implementation != name:
            raise Error(f"model: {type(model).__name__} cannot switch its attention to attn; "
                        f"load it with attn_implementation={name!r}")
    try:
        batch = tokenizer(text, return_tensors="pt").to(model.device)
        with torch.inference_mode():
            output = model(**batch, output_attentions=True)
    finally:
        if before != name:
            model.set_attn_implementation(before)
        register(name)
    attentions = getattr(output, "attentions", None)
    if not attentions:
        raise Error(f"model: expected an output with attentions, given a "
                    f"{type(output).__name__} without them (an encoder-decoder model?)")
    ids = batch["input_ids"][0].tolist()
    special_ids = set(tokenizer.all_special_ids)
    contributions = None
    if len(norms) == len(attentions):
        contributions = []
        for layer, norm in zip(attentions, norms):
            weights = layer[0].double().cpu()
            heads, length = weights.shape[0], weights.shape[-1]
            norm = norm.cpu()[:, :length].repeat_interleave(heads // norm.shape[0], dim=0)
            contributions.append((weights * norm[:, None, :]).float())
    viz.model([layer.float().cpu() for layer in attentions], path,
              tokens=tokenizer.convert_ids_to_tokens(ids),
              special=[i in special_ids for i in ids],
              title=title if title is not None else
              f"{_model_name(model)}: {text}", contributions=contributions)
    return tuple(attentions)
