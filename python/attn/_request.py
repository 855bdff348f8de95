"""What every entry point of attn shares below it: the options (one attn._attn.Options
built from the same keywords for attention, weights, attention_backward, attention_state,
decode and attn.dist.attention), and the shaping of the caller's arrays into the 4-D
[B, H, S, D] views the extension reads in place.

The options' values are checked in attn's core (the same words as for C++ callers); this
module checks only what core cannot see: Python types, the names of choices ("top-left"),
a window given as a pair, torch's thread count."""

import typing

import numpy

from . import _arrays
from ._attn import Options
from ._block_mask import BlockMask
from ._position_bias import PositionBias
from ._errors import ArgumentTypeError, Error

LAYOUTS = ("bhsd", "bshd")
ALIGNMENTS = ("top-left", "bottom-right")


class OptionKeywords(typing.TypedDict, total=False):
    """The keywords of OPTIONS_DOC, for type checkers (attn/__init__.pyi)."""

    causal: bool
    causal_align: str
    scale: typing.Optional[float]
    window: typing.Tuple[int, int]
    softcap: float
    alibi_slopes: typing.Any
    sinks: typing.Any
    cu_seqlens_q: typing.Any
    cu_seqlens_k: typing.Any
    position_offset: int
    threads: typing.Optional[int]
    pv_precision: str
    dropout_p: float
    dropout_seed: typing.Optional[int]
    backend: str
    block_mask: typing.Any
    position_bias: typing.Any


OPTIONS_DOC = """
    Options (every default means "off"; the same keywords for attn.attention,
    attn.weights, attn.attention_backward, attn.attention_state, attn.decode and
    attn.dist.attention, where they apply):
        causal: hide keys after the query's position.
        causal_align: "top-left" (PyTorch: query i sits at key i) or "bottom-right"
            (FlashAttention: query i sits at key i + Lk - Lq). Also places the window and
            ALiBi distances.
        scale: multiplies q.k; None means 1/sqrt(D).
        window: (left, right): the query at key position p sees keys p-left .. p+right;
            -1 is unbounded on that side.
        softcap: > 0 caps scores as softcap * tanh(score / softcap); 0.0 is off.
        alibi_slopes: [Hq] numbers; subtracts slope * |query position - key position|.
        sinks: [Hq] numbers; an extra logit per head that takes weight but has no value.
        cu_seqlens_q, cu_seqlens_k: packed variable-length sequences (flash_attn_varlen):
            B = 1 and sequence s owns rows cu_seqlens_q[s]:cu_seqlens_q[s+1] of q and
            cu_seqlens_k[s]:cu_seqlens_k[s+1] of k and v. Give both or neither.
        position_offset: an int added to every query's key position after the alignment,
            for a slice of a longer sequence (a chunk of a prompt, a shard): query i sits
            at key i + position_offset (top-left) or i + Lk - Lq + position_offset.
        threads: None follows torch.get_num_threads() when q is a torch tensor, else uses
            ATTN_NUM_THREADS from the environment, else every core; an int bounds the
            kernel's threads. Results do not depend on it.
        pv_precision: "bf16" (the default): the weights rounded to bfloat16 once for the
            product P V where it runs on bf16 products (bf16 V on AMX tiles; where the
            CPU's vdpbf16ps runs at the float32 FMA's rate, as on AMD's Zen 4 and 5, bf16 V
            without AMX and a bf16 cache in decode and paged attention), as
            PyTorch's and FlashAttention's kernels round them, each weight within 2^-8 of
            itself, at twice the float32 rate or more; against fp16 V on AMX tiles, two
            bfloat16 parts of each weight (within 2^-15 of itself), finer than fp16 outputs;
            elsewhere, and for float32 V, it changes nothing. "exact": float32 weights in
            P V everywhere. The weights and lse outputs are exact either way.
        dropout_p: dropout of the weights in P V, for training (PyTorch's and
            FlashAttention's): each weight is kept and scaled by 1 / (1 - dropout_p) with
            probability 1 - dropout_p, else 0. lse and the weights outputs are those before
            dropout. Forward and backward only (attn.decode and paged attention refuse it).
        dropout_seed: which weights are dropped is a function of this seed and the
            weight's (batch, head, query row, key) alone (attn.dropout_mask shows it), so a
            backward call with the same seed drops what forward dropped. None (with
            dropout_p > 0): attn.attention draws one from torch's default generator when q
            is a torch tensor, else from NumPy's global one (torch.manual_seed and
            numpy.random.seed make it repeatable); attn.attention_backward needs the
            forward's.
        block_mask: an attn.BlockMask (a pattern stored by blocks: documents, prefix-LM,
            chunks, a window with global tokens, any predicate), in place of mask: the
            kernels skip its empty blocks and read bits only for its partial ones. With
            cu_seqlens, its batch entry s is sequence s. Forward, weights and backward;
            decode and paged attention refuse it.
        position_bias: an attn.PositionBias (a learned table by relative position: T5's
            buckets or clipped distances, per head), added to each score inside the
            kernels after softcap and ALiBi; its table's gradient comes back through
            autograd and attn.attention_backward. Forward, weights and backward; decode and
            paged attention refuse it.
        backend: "automatic" (attn's fast CPU kernels, or its float64 reference where they
            do not serve the call, with an attn.FallbackWarning once), "fast" (raise
            instead) or "reference" (the float64 reference, asked for).
"""

_OPTION_NAMES = tuple(OptionKeywords.__annotations__)


def _window(window):
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ArgumentTypeError(f"window: expected a pair (left, right) of ints, given {window!r}")
    expected = "an int (-1 for unbounded)"
    return (_arrays.integer(window[0], "window.left", expected),
            _arrays.integer(window[1], "window.right", expected))


def threads_of(threads, like=None):
    """The extension's thread count: threads, or for None, torch.get_num_threads() when
    like is a torch tensor (so attn follows torch.set_num_threads), else 0 (the kernel's
    default: ATTN_NUM_THREADS or every core)."""
    if threads is None:
        return _arrays._torch().get_num_threads() if _arrays.is_torch(like) else 0
    threads = _arrays.integer(threads, "threads", "None or a positive int", high=_arrays.INT_MAX)
    if threads < 1:
        raise Error(f"threads: expected None or a positive int, given {threads}")
    return threads


def options(like, keywords, function, refused=()):
    """keywords (a function's **options): an attn._attn.Options. like: the query, whose
    kind (torch or not) sets the default thread count. refused: (name, why) pairs of
    options `function` does not take."""
    for name in keywords:
        if name not in _OPTION_NAMES:
            raise ArgumentTypeError(
                f"{function}() got an unexpected keyword argument {name!r} (its options: "
                f"{', '.join(n for n in _OPTION_NAMES if n not in dict(refused))})")
    for name, why in refused:
        if name in keywords:
            raise ArgumentTypeError(f"{name}: not an option of {function}(): {why}")
    o = Options()
    o.causal = _arrays.flag(keywords.get("causal", False), "causal")
    causal_align = keywords.get("causal_align", "top-left")
    if causal_align not in ALIGNMENTS:
        raise Error(f"causal_align: expected 'top-left' or 'bottom-right', given {causal_align!r}")
    o.bottom_right = causal_align == "bottom-right"
    o.scale = _arrays.number(keywords.get("scale"), "scale", allow_none=True, finite=False)
    o.window = _window(keywords.get("window", (-1, -1)))
    o.softcap = _arrays.number(keywords.get("softcap", 0.0), "softcap", finite=False)
    o.alibi_slopes = _arrays.per_head(keywords.get("alibi_slopes"), "alibi_slopes")
    o.sinks = _arrays.per_head(keywords.get("sinks"), "sinks")
    cu_q, cu_k = keywords.get("cu_seqlens_q"), keywords.get("cu_seqlens_k")
    o.cu_seqlens_q = [] if cu_q is None else _arrays.offsets(cu_q, "cu_seqlens_q")
    o.cu_seqlens_k = [] if cu_k is None else _arrays.offsets(cu_k, "cu_seqlens_k")
    o.position_offset = _arrays.integer(keywords.get("position_offset", 0), "position_offset",
                                        "an int")
    o.threads = threads_of(keywords.get("threads"), like)
    o.pv_precision = keywords.get("pv_precision", "bf16")
    o.dropout_p = _arrays.number(keywords.get("dropout_p", 0.0), "dropout_p", finite=False)
    seed = keywords.get("dropout_seed")
    if seed is None and o.dropout_p != 0.0 and function == "attention_backward":
        raise Error(f"dropout_seed: expected the forward call's seed (an int: backward must "
                    f"drop the weights forward dropped), given None with dropout_p = "
                    f"{o.dropout_p}")
    seed = draw_dropout_seed(keywords, like).get("dropout_seed")
    if seed is not None:
        o.dropout_seed = _arrays.integer(seed, "dropout_seed", "an int", low=0, high=2**64 - 1)
    o.backend = keywords.get("backend", "automatic")
    block_mask = keywords.get("block_mask")
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise ArgumentTypeError(f"block_mask: expected an attn.BlockMask or None, given "
                                    f"{type(block_mask).__name__}")
        o.block_mask = block_mask._ext
    bias = keywords.get("position_bias")
    if bias is not None:
        if not isinstance(bias, PositionBias):
            raise ArgumentTypeError(f"position_bias: expected an attn.PositionBias or None, "
                                    f"given {type(bias).__name__}")
        o.set_position_bias(bias.values(), bias.columns, bias.buckets, bias.offset,
                            bias.max_distance)
    return o


def draw_dropout_seed(keywords, like):
    """keywords with a dropout_seed drawn where dropout_p > 0 leaves it None: from torch's
    default generator when like is a torch tensor, else from NumPy's global one."""
    if keywords.get("dropout_seed") is not None or not keywords.get("dropout_p"):
        return keywords
    torch = _arrays._torch()
    if _arrays.is_torch(like):
        seed = int(torch.randint(2**62, (), dtype=torch.int64))
    else:
        seed = int(numpy.random.randint(2**62, dtype=numpy.int64))
    return dict(keywords, dropout_seed=seed)


def _rank_error(name, x, layout):
    if layout == "bhsd":
        forms = "[L, D], [H, L, D] or [B, H, L, D]"
    else:
        forms = "[L, D], [L, H, D] or [B, L, H, D]"
    return Error(
        f"{name}: expected 2, 3 or 4 dims ({forms} for layout '{layout}'), "
        f"given {x.ndim} dims with shape {_arrays.shape(x)}"
    )


def to_bhsd(x, layout):
    """x: [L, D] | [H, L, D] | [B, H, L, D] (bhsd) or [L, D] | [L, H, D] | [B, L, H, D]
    (bshd) -> a [B, H, L, D] view of the same memory."""
    dims = _arrays.shape(x)
    if x.ndim == 2 or layout == "bhsd":
        return _arrays.reshape(x, (1,) * (4 - x.ndim) + dims)
    return _arrays.permute(_arrays.reshape(x, (1,) * (4 - x.ndim) + dims), (0, 2, 1, 3))


def input_view(x, layout):
    """The [B, H, L, D] view the extension reads for an input x."""
    return _arrays.readable(to_bhsd(x, layout))


def user_shape(bhsd, rank, layout):
    """[B, H, L, D] -> the shape of that array in the caller's rank and layout."""
    batch, heads, length, dim = bhsd
    if rank == 2:
        return (length, dim)
    if layout == "bhsd":
        return (batch, heads, length, dim)[4 - rank :]
    return (batch, length, heads, dim)[4 - rank :]


def broadcast_mask(mask, heads_shape, len_q, len_k, name):
    """mask: 4-D [B or 1, H or 1, Lq or 1, Lk or 1] -> [B or 1, H or 1, Lq, Lk], with Lq and
    Lk broadcast (stride 0, or a copy where the last dim must become contiguous)."""
    dims = _arrays.shape(mask)
    batch, heads = heads_shape
    fits = (
        dims[0] in (1, batch)
        and dims[1] in (1, heads)
        and dims[2] in (1, len_q)
        and dims[3] in (1, len_k)
    )
    if not fits:
        raise Error(
            f"{name}: expected a shape broadcastable to [{batch}, {heads}, {len_q}, {len_k}] "
            f"(batch, query heads, query length, key length), given {dims}"
        )
    return _arrays.readable(_arrays.broadcast(mask, dims[:2] + (len_q, len_k)))


def mask_view(mask, heads_shape, len_q, len_k):
    """A mask of 2 to 4 dims broadcastable to [B, H, Lq, Lk] (None: none) as the
    [B or 1, H or 1, Lq, Lk] view the extension reads, or None."""
    if mask is None:
        return None
    m = _arrays.as_array(mask, "mask", allow_bool=True)
    if not 2 <= m.ndim <= 4:
        raise Error(
            f"mask: expected 2 to 4 dims ([..., Lq, Lk]), given {m.ndim} dims with shape "
            f"{_arrays.shape(m)}"
        )
    m4 = _arrays.reshape(m, (1,) * (4 - m.ndim) + _arrays.shape(m))
    return broadcast_mask(m4, heads_shape, len_q, len_k, "mask")


def ext(x):
    """An array as the extension takes it, or None."""
    return None if x is None else _arrays.for_extension(x)


def prepare(q, others, layout, keywords, function, q_name="q", refused=()):
    """The checks attn.attention, attn.weights, attn.attention_backward and
    attn.dist.attention share. others: (name, array) pairs of the same rank as q, which
    errors call q_name; keywords: the function's options. Returns (q, [others as arrays],
    the Options, a function taking an input to its [B, H, L, D] view)."""
    q = _arrays.as_array(q, q_name)
    others = [(name, _arrays.as_array(x, name)) for name, x in others]
    if layout not in LAYOUTS:
        raise Error(f"layout: expected 'bhsd' or 'bshd', given {layout!r}")
    rank = q.ndim
    if rank not in (2, 3, 4):
        raise _rank_error(q_name, q, layout)
    for name, x in others:
        if x.ndim != rank:
            raise Error(
                f"{name}: expected {rank} dims (as {q_name}), given {x.ndim} dims with shape "
                f"{_arrays.shape(x)}"
            )
    o = options(q, keywords, function, refused)
    return q, [x for _, x in others], o, lambda x: input_view(x, layout)
