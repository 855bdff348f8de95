"""The lesson's three steps, one function each: attn.scores, attn.softmax, attn.context.
They compute in float64 and hand back the extension's result without a copy."""

from . import _arrays
from ._errors import Error
from . import _attn

_KINDS = ("dot", "scaled_dot", "general", "additive")


def _to_4d(x, name, ranks=(2, 3, 4), form="[..., L, D]"):
    if x.ndim not in ranks:
        raise Error(
            f"{name}: expected {' or '.join(map(str, ranks))} dims {form}, given {x.ndim} dims "
            f"with shape {_arrays.shape(x)}"
        )
    view = _arrays.reshape(x, (1,) * (4 - x.ndim) + _arrays.shape(x))
    return _arrays.for_extension(_arrays.readable(view))


def _same_rank(name, x, first_name, first):
    if x.ndim != first.ndim:
        raise Error(
            f"{name}: expected {first.ndim} dims (as {first_name}), given {x.ndim} dims with "
            f"shape {_arrays.shape(x)}"
        )


def _parameter(value, name, kind, wanted_shape, described):
    """A score parameter (weight, projections, energy): required for its own kind,
    refused for the others. Returns the 4-D [1, 1, rows, cols] view the extension reads."""
    if kind not in described:
        if value is not None:
            raise Error(f"{name}: expected None for kind={kind!r} (used by kind={described[0]!r})")
        return None
    if value is None:
        raise Error(f"{name}: expected an array of shape {wanted_shape} for kind={kind!r}, given None")
    array = _arrays.as_array(value, name)
    given = _arrays.shape(array)
    if any(w is not None and w != g for w, g in zip(wanted_shape, given)) or len(given) != len(wanted_shape):
        shown = tuple("A" if w is None else w for w in wanted_shape)
        raise Error(f"{name}: expected shape {shown}, given {given}")
    return _to_4d(array, name, ranks=(len(wanted_shape),), form=str(wanted_shape))


def scores(q, k, kind="scaled_dot", scale=None, weight=None, query_projection=None,
           key_projection=None, energy=None):
    """Step 1: a score between every query and every key.

    Shapes:
        q: [Lq, Dq] | [Hq, Lq, Dq] | [B, Hq, Lq, Dq]
        k: [Lk, Dk] | [Hkv, Lk, Dk] | [B, Hkv, Lk, Dk]   (same rank; Hq a multiple of Hkv)
        returns: [Lq, Lk] | [Hq, Lq, Lk] | [B, Hq, Lq, Lk] in q's dtype
    kind:
        "dot":        q . k                                 (Dq == Dk)
        "scaled_dot": (q . k) * scale, scale None -> 1/sqrt(Dq)   (Dq == Dk)
        "general":    q^T W k (Luong), weight W: [Dq, Dk]
        "additive":   w^T tanh(W1 q + W2 k) (Bahdanau), query_projection W1: [A, Dq],
                      key_projection W2: [A, Dk], energy w: [A]
    Parameters a kind does not use must stay None.
    """
    if kind not in _KINDS:
        raise Error(f"kind: expected one of {', '.join(map(repr, _KINDS))}, given {kind!r}")
    q = _arrays.as_array(q, "q")
    k = _arrays.as_array(k, "k")
    _same_rank("k", k, "q", q)
    q4, k4 = _to_4d(q, "q"), _to_4d(k, "k")
    if scale is not None and kind != "scaled_dot":
        raise Error(f"scale: expected None for kind={kind!r} (used by kind='scaled_dot')")
    dim_q, dim_k = _arrays.shape(q)[-1], _arrays.shape(k)[-1]
    hidden = None  # A, the additive score's hidden size, read off energy: [A]
    if kind == "additive" and energy is not None:
        energy = _arrays.as_array(energy, "energy")
        hidden = _arrays.shape(energy)[0] if energy.ndim == 1 else None
    result = _attn.scores(
        q4, k4,
        kind=kind,
        scale=_arrays.number(scale, "scale", allow_none=True),
        weight=_parameter(weight, "weight", kind, (dim_q, dim_k), ("general",)),
        query_projection=_parameter(query_projection, "query_projection", kind, (hidden, dim_q), ("additive",)),
        key_projection=_parameter(key_projection, "key_projection", kind, (hidden, dim_k), ("additive",)),
        energy=_parameter(energy, "energy", kind, (None,), ("additive",)),
    )
    lead = _arrays.shape(q)[:-2]
    len_q, len_k = _arrays.shape(q)[-2], _arrays.shape(k)[-2]
    return _arrays.from_extension(result.reshape(lead + (len_q, len_k)), q)


def softmax(scores):
    """Step 2: softmax weights over the last axis, rows summing to 1.

    Shapes: scores [Lk] | [Lq, Lk] | [H, Lq, Lk] | [B, H, Lq, Lk] -> weights of the same
    shape and dtype. The row maximum is subtracted first (for stability); -inf scores get
    weight 0 and a row that is -inf everywhere gets zeros, never NaN. NaN scores raise
    ValueError.
    """
    s = _arrays.as_array(scores, "scores")
    result = _attn.softmax(_to_4d(s, "scores", ranks=(1, 2, 3, 4), form="[..., Lk]"))
    return _arrays.from_extension(result.reshape(_arrays.shape(s)), s)


def context(weights, v, check=True, tolerance=1e-5):
    """Step 3: the context vector C = sum_j weights_j v_j for every query row.

    Shapes:
        weights: [Lq, Lk] | [Hq, Lq, Lk] | [B, Hq, Lq, Lk]
        v:       [Lk, Dv] | [Hkv, Lk, Dv] | [B, Hkv, Lk, Dv]   (same rank; Hq a multiple of Hkv)
        returns: [Lq, Dv] | [Hq, Lq, Dv] | [B, Hq, Lq, Dv] in v's dtype
    check: first verify that weights are finite, non-negative and that each row sums to 1
    within tolerance (an all-zero row, a fully masked one, passes); raises ValueError if not.
    """
    w = _arrays.as_array(weights, "weights")
    v = _arrays.as_array(v, "v")
    _same_rank("v", v, "weights", w)
    check = _arrays.flag(check, "check")
    tolerance = _arrays.number(tolerance, "tolerance")
    result = _attn.context(_to_4d(w, "weights", form="[..., Lq, Lk]"), _to_4d(v, "v", form="[..., Lk, Dv]"),
                           check=check, tolerance=tolerance)
    lead = _arrays.shape(w)[:-2]
    return _arrays.from_extension(result.reshape(lead + (_arrays.shape(w)[-2], _arrays.shape(v)[-1])), v)
