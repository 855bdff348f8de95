"""attn.rollout: attention rollout across a model's layers (Abnar & Zuidema, ACL 2020)."""

from . import _arrays
from ._attn import rollout as _rollout
from .viz import _layers


def rollout(weights, residual=0.5):
    """How much each position after layer l draws from each input token, through the
    attention and the residual connection of every layer up to l (Abnar & Zuidema, ACL 2020,
    "Quantifying Attention Flow in Transformers"): a layer's weights show mixtures of the
    layer's inputs; rollout multiplies them down the stack, so upper layers read as input
    tokens. For encoder models (all-MiniLM-L6-v2 and the like), whose attention is
    self-attention over one text.

        A_l = residual I + (1 - residual) mean over heads of weights[l], rows renormalised
        R_0 = A_0,  R_l = A_l R_(l-1)

    Shapes: weights [layers, H, L, L], or a sequence of one [H, L, L] or [1, H, L, L] per
    layer (transformers' output.attentions for one text); returns float64 [layers, L, L]
    (a torch tensor when the weights are torch tensors). residual: the identity's share,
    in [0, 1] (0.5, the paper's). Bad input raises ValueError naming the argument."""
    residual = _arrays.number(residual, "residual", finite=False)
    stacked = _layers(weights)
    out = _rollout(stacked, residual)
    shape = _arrays.shape(out)
    like = weights[0] if isinstance(weights, (list, tuple)) else weights
    return _arrays.like_kind(_arrays.reshape(out, (shape[0],) + shape[2:]), like)
