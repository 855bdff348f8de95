"""Pictures of attention weights: a heatmap of one head (SVG or PNG), a self-contained
HTML page of every head with a BertViz-like head view, one page of every layer of a model,
and one query's context vector drawn as the blend of the value vectors that it is.

    w = attn.attention(q, k, v, return_weights=True)[1]
    attn.viz.heatmap(w, "head0.svg", tokens=words)
    attn.viz.html(w, "layer.html", tokens=words)
    attn.viz.model(output.attentions, "model.html", tokens=words)   # every layer of a model
    attn.viz.blend(w, v, "query3.svg", row=3, tokens=words)

Files appear whole or not at all: they are written under a temporary name and renamed.
"""

import os
from typing import Optional, Sequence, Union

import numpy as np

from . import _arrays
from ._errors import ArgumentTypeError, Error
from . import _attn

PathLike = Union[str, "os.PathLike[str]"]

_HEATMAP_SUFFIXES = (".svg", ".png")
_PAGE_SUFFIXES = (".html", ".htm")


def _path(path, suffixes, other):
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"path: expected a str or os.PathLike, given {type(path).__name__}")
    path = os.fspath(path)
    if not path.lower().endswith(suffixes):
        raise Error(
            f"path: expected a file name ending in {' or '.join(suffixes)}, given {path!r} "
            f"(use attn.viz.{other} for the other formats)"
        )
    return path


def _matrices(array, name, dims):
    """`array` as the 4-D view the extension reads; dims names its 2-, 3- and 4-D shapes.
    A picture only reads the values, so tensors that need gradients are detached."""
    array = _arrays.as_array(array, name, detach=True)
    if array.ndim not in (2, 3, 4):
        raise Error(
            f"{name}: expected 2 to 4 dims {dims}, given {array.ndim} dims with shape "
            f"{_arrays.shape(array)}"
        )
    view = _arrays.reshape(array, (1,) * (4 - array.ndim) + _arrays.shape(array))
    return _arrays.for_extension(_arrays.readable(view))


def _weights(weights):
    return _matrices(weights, "weights", "[Lq, Lk], [H, Lq, Lk] or [B, H, Lq, Lk]")


def _tokens(tokens, name="tokens"):
    if tokens is None:
        return []
    if isinstance(tokens, str):
        raise ArgumentTypeError(f"{name}: expected a sequence of str, given a single str")
    tokens = list(tokens)
    for i, token in enumerate(tokens):
        if not isinstance(token, str):
            raise ArgumentTypeError(f"{name}: expected str items, given {type(token).__name__} "
                                    f"at {i}")
    return tokens


def _index(value, name):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name}: expected an int, given {type(value).__name__}")
    if value < 0:
        raise Error(f"{name}: expected an int >= 0, given {value}")
    return value


def _draw(weights, path, tokens, batch, head, downsample, max_cells, title, key_tokens=None):
    if downsample not in ("max", "mean"):
        raise Error(f"downsample: expected 'max' or 'mean', given {downsample!r}")
    if max_cells is not None:
        _index(max_cells, "max_cells")
        if max_cells < 1:
            raise Error(f"max_cells: expected an int >= 1 or None, given {max_cells}")
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(f"title: expected a str or None, given {type(title).__name__}")
    if key_tokens is not None and tokens is None:
        raise Error("key_tokens: expected tokens too (key_tokens label the keys when tokens "
                    "label the queries, as in cross-attention)")
    key_tokens = [] if key_tokens is None else _tokens(key_tokens, "key_tokens")
    _attn.draw(_weights(weights), path, tokens=_tokens(tokens), key_tokens=key_tokens,
               batch=_index(batch, "batch"),
               head=_index(head, "head"), downsample=downsample, max_cells=max_cells or 0,
               title=title or "")


def heatmap(weights, path: PathLike, tokens: Optional[Sequence[str]] = None, head: int = 0,
            batch: int = 0, downsample: str = "max", max_cells: Optional[int] = None,
            title: Optional[str] = None, key_tokens: Optional[Sequence[str]] = None) -> None:
    """Draw one head's weights as a heatmap: query rows down, keys across, a colour bar.

    Shapes:
        weights: [Lq, Lk] | [H, Lq, Lk] | [B, H, Lq, Lk], float16/bfloat16/float32/float64
    path: ending in .svg or .png (the format).
    tokens: Lq tokens label the queries, Lk the keys (both for self-attention); None: indices.
    key_tokens: with tokens for the queries, Lk tokens for the keys (cross-attention: output
        words down, input words across).
    head, batch: which matrix to draw.
    downsample: "max" or "mean", how a block of weights becomes one cell when a side is
        longer than max_cells (None: 512).
    title: None names the head.
    """
    _draw(weights, _path(path, _HEATMAP_SUFFIXES, "html"), tokens, batch, head, downsample,
          max_cells, title, key_tokens)


def html(weights, path: PathLike, tokens: Optional[Sequence[str]] = None, batch: int = 0,
         downsample: str = "max", max_cells: Optional[int] = None,
         title: Optional[str] = None, key_tokens: Optional[Sequence[str]] = None) -> None:
    """Write a self-contained HTML page (no network needed) of every head of batch entry
    `batch`: small heatmaps of all heads, one head large, and a head view where pointing at
    a query token draws lines to the keys it attends to, thicker for larger weights.

    Shapes:
        weights: [Lq, Lk] | [H, Lq, Lk] | [B, H, Lq, Lk], float16/bfloat16/float32/float64
    path: ending in .html or .htm.
    tokens, key_tokens, downsample, title: as for heatmap; max_cells None means 128 per head.
    """
    _draw(weights, _path(path, _PAGE_SUFFIXES, "heatmap"), tokens, batch, 0, downsample,
          max_cells, title, key_tokens)


def _layers(weights, name="weights"):
    """A model's weights (or what has their shape, named `name` in errors) as one
    [layers, H, L, L] array: given so, or as a sequence of one [H, L, L] or [1, H, L, L]
    array per layer (transformers' output.attentions)."""
    if not isinstance(weights, (list, tuple)):
        weights = _arrays.as_array(weights, name)
        if weights.ndim != 4:
            raise Error(f"{name}: expected [layers, H, L, L] or a sequence of [1, H, L, L], "
                        f"given {weights.ndim} dims with shape {_arrays.shape(weights)}")
        return _arrays.for_extension(_arrays.readable(weights))
    if not weights:
        raise Error(f"{name}: expected at least one layer, given an empty sequence")
    layers = []
    for i, layer in enumerate(weights):
        layer = _arrays.as_array(layer, f"{name}[{i}]")
        shape = _arrays.shape(layer)
        if not (layer.ndim == 3 or (layer.ndim == 4 and shape[0] == 1)):
            raise Error(f"{name}[{i}]: expected [H, L, L] or [1, H, L, L] (one text), "
                        f"given shape {shape}")
        layer = _arrays.reshape(layer, shape[-3:])
        if layers and _arrays.shape(layer) != _arrays.shape(layers[0]):
            raise Error(f"{name}[{i}]: expected the shape of {name}[0], "
                        f"{_arrays.shape(layers[0])}, given {_arrays.shape(layer)}")
        layers.append(layer)
    if all(_arrays.is_torch(layer) for layer in layers):
        stacked = _arrays._torch().stack(layers)
    else:
        stacked = np.stack([np.asarray(layer.float() if _arrays.is_torch(layer) else layer)
                            for layer in layers])
    return _arrays.for_extension(_arrays.readable(stacked))


def _flags(special, count):
    if special is None:
        return []
    if isinstance(special, str):
        raise ArgumentTypeError("special: expected a sequence of bool, given a str")
    special = list(special)
    for i, flag in enumerate(special):
        if type(flag).__name__ not in ("bool", "bool_"):
            raise ArgumentTypeError(f"special: expected bool items, given {type(flag).__name__} at {i}")
    if len(special) != count:
        raise Error(f"special: expected {count} flags (one per token), given {len(special)}")
    return [bool(flag) for flag in special]


def model(weights, path: PathLike, tokens: Optional[Sequence[str]] = None,
          special: Optional[Sequence[bool]] = None, title: Optional[str] = None,
          contributions=None) -> None:
    """Write one self-contained HTML page (no network needed) of a whole model's attention
    over one text: a layer x head grid of small heatmaps with each layer's mean over heads,
    the chosen head large with the tokens on both axes, a head view (lines from each query
    token to the keys it attends to), a layer and head selector, a toggle between one colour
    scale for the whole model and one per head, and a toggle that hides special tokens
    (`special`), renormalising each shown row over the shown keys, and a choice of what is
    shown: the weights, each input's contribution ||alpha_ij v_j|| (with `contributions`:
    a large weight on a small value vector adds little) or the attention rollout through
    the layers (attn.rollout of the weights). The controls and the colour bar stay at the
    top of the window. The weights are stored exactly (float32).

    Shapes:
        weights: [layers, H, L, L], or a sequence of one [H, L, L] or [1, H, L, L] per layer
                 (e.g. transformers' output.attentions for one text)
    path: ending in .html or .htm.
    tokens: L tokens label both axes; None: indices.
    special: None, or L bools, True for the tokens that the toggle hides ([CLS], [SEP], ...).
    title: None: "Attention in every layer".
    contributions: None, or the weights' shape and forms: alpha_ij ||v_j|| (attn.contributions
        per layer, or the weights times each key's value norm).
    attn.integrations.transformers.draw_model runs a model and calls this.
    """
    path = _path(path, _PAGE_SUFFIXES, "heatmap")
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(f"title: expected a str or None, given {type(title).__name__}")
    tokens = _tokens(tokens)
    weights = _layers(weights)
    if contributions is not None:
        contributions = _layers(contributions, "contributions")
    _attn.draw_model(weights, path, tokens=tokens, special=_flags(special, _arrays.shape(weights)[2]),
                     title=title or "", contributions=contributions)


def _check_blend_arguments(path, top, title):
    """The checks attn.viz.blend and attn.viz.steps share: path's type, top, title."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"path: expected a str or os.PathLike, given {type(path).__name__}")
    _index(top, "top")
    if top < 1:
        raise Error(f"top: expected an int >= 1, given {top}")
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(f"title: expected a str or None, given {type(title).__name__}")


def steps(weights, value, path: PathLike, tokens: Optional[Sequence[str]] = None,
          key_tokens: Optional[Sequence[str]] = None, top: int = 10,
          title: Optional[str] = None) -> None:
    """Write a self-contained HTML page that steps through generation, one query row a step
    (a slider, buttons, the arrow keys, #step=N): at each step every head's blend of the value
    vectors by that row's weights (as attn.viz.blend draws one), the context vector the step
    read. For a decoder's cross-attention over its encoder's outputs: the rows are the output
    words, the keys the input words.

    Shapes (one sequence):
        weights: [steps, Lk] | [H, steps, Lk] | [1, H, steps, Lk], each row summing to 1
        value:   [Lk, Dv] | [Hkv, Lk, Dv] | [1, Hkv, Lk, Dv], H a multiple of Hkv
    path: ending in .html or .htm.
    tokens: one name per step (the word it produced); key_tokens: Lk input words.
    top: inputs drawn in full per blend, the rest summed. title: None: a generic one.
    """
    _check_blend_arguments(path, top, title)
    value = _matrices(value, "value", "[Lk, Dv], [Hkv, Lk, Dv] or [1, Hkv, Lk, Dv]")
    weights = _weights(weights)
    _, _, count, length = _arrays.shape(weights)
    names, inputs = _tokens(tokens), _tokens(key_tokens, "key_tokens")
    for name, given, want, what in (("tokens", names, count, "step"),
                                    ("key_tokens", inputs, length, "input")):
        if given and len(given) != want:
            raise Error(f"{name}: expected {want} tokens (one per {what}), given {len(given)}")
    _attn.draw_steps(weights, value, os.fspath(path), steps=names, inputs=inputs, top=top,
                     title=title or "")


def blend(weights, value, path: PathLike, row: int = 0, tokens: Optional[Sequence[str]] = None,
          head: int = 0, batch: int = 0, top: int = 10, title: Optional[str] = None) -> None:
    """Draw query `row`'s context C = sum_i alpha_i v_i as a blend of the value vectors: each
    input's value vector as a row of cells coloured by value (blue < 0 < red, one scale),
    its weight alpha_i as a bar, the scaled row alpha_i v_i, and their sum C, which is
    attn's context for these weights. Inputs past the `top` largest weights are summed into
    one row, so the picture still adds up to C.

    Shapes:
        weights: [Lq, Lk] | [H, Lq, Lk] | [B, H, Lq, Lk], float16/bfloat16/float32/float64
        value:   [Lk, Dv] | [Hkv, Lk, Dv] | [B, Hkv, Lk, Dv], H a multiple of Hkv
    path: ending in .svg, .png or .html (the format; the page shows numbers on hover).
    tokens: Lk tokens, one per input; None: indices.
    row, head, batch: which query's weights to draw.
    title: None names the query.
    """
    _check_blend_arguments(path, top, title)
    value = _matrices(value, "value", "[Lk, Dv], [Hkv, Lk, Dv] or [B, Hkv, Lk, Dv]")
    _attn.draw_blend(_weights(weights), value, os.fspath(path), tokens=_tokens(tokens),
                     batch=_index(batch, "batch"), head=_index(head, "head"),
                     row=_index(row, "row"), top=top, title=title or "")
