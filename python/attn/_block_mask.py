"""attn.BlockMask: a boolean attention pattern stored by blocks (attn/block_mask.hpp), built
once and given to attn.attention, attn.weights and attn.attention_backward as the
block_mask option, as FlexAttention's BlockMask."""

import numpy

from . import _arrays
from ._attn import BlockMask as _Ext
from ._errors import ArgumentTypeError, Error

DEFAULT_BLOCK_SIZE = 128


def _size(value, name):
    return _arrays.integer(value, name, "a positive int", low=1, high=_arrays.INT_MAX)


def _integers(values, name):
    """Integers (a list, NumPy array or tensor) as a NumPy int64 array of their shape."""
    array = _arrays._small_array(values, name)
    if array.dtype == object or array.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{name}: expected integers, given dtype {array.dtype}")
    return array.astype(numpy.int64)


class BlockMask:
    """A boolean pattern (True: the query may attend to the key) over [batch, heads,
    len_q, len_k], stored as blocks of block_size x block_size, each "empty", "full" or
    "partial" (only partial blocks keep their bits). Batch or heads of 1 broadcast. With
    cu_seqlens, batch entry s is packed sequence s, from its own first query and key.

    The kernels skip empty blocks, do no masking work on full ones and read bits only for
    partial ones, in forward, lse, weights and backward; no [Lq, Lk] array is held.

    Build one with from_predicate (a vectorised function of index arrays, FlexAttention's
    mask_mod), from_dense, documents, prefix_lm, chunked or window_and_global."""

    def __init__(self, ext):
        if not isinstance(ext, _Ext):
            raise ArgumentTypeError("BlockMask: build one with BlockMask.from_predicate, "
                                    "from_dense, documents, prefix_lm, chunked or "
                                    "window_and_global")
        self._ext = ext

    @classmethod
    def from_predicate(cls, predicate, batch, heads, len_q, len_k,
                       block_size=DEFAULT_BLOCK_SIZE):
        """predicate(b, h, q_idx, kv_idx) -> a bool array broadcastable to the shapes of its
        arguments: it is called once per query block with int64 index arrays shaped
        [batch, 1, 1, 1], [1, heads, 1, 1], [1, 1, rows, 1] and [1, 1, 1, len_k] (NumPy,
        so a torch-style mask_mod written with operators works on them), never once per
        element."""
        if not callable(predicate):
            raise ArgumentTypeError(f"predicate: expected a function, given {predicate!r}")
        batch, heads = _size(batch, "batch"), _size(heads, "heads")
        len_q, len_k = _size(len_q, "len_q"), _size(len_k, "len_k")
        block_size = _size(block_size, "block_size")
        b = numpy.arange(batch, dtype=numpy.int64).reshape(batch, 1, 1, 1)
        h = numpy.arange(heads, dtype=numpy.int64).reshape(1, heads, 1, 1)
        kv = numpy.arange(len_k, dtype=numpy.int64).reshape(1, 1, 1, len_k)

        def stripe(qb):
            first = qb * block_size
            q = numpy.arange(first, min(first + block_size, len_q),
                             dtype=numpy.int64).reshape(1, 1, -1, 1)
            shown = numpy.asarray(predicate(b, h, q, kv))
            if shown.dtype != numpy.bool_:
                raise Error(f"predicate: expected a bool array, given dtype {shown.dtype}")
            full = (batch, heads, q.shape[2], len_k)
            try:
                shown = numpy.broadcast_to(shown, full)
            except ValueError:
                raise Error(f"predicate: expected a result broadcastable to {full}, given "
                            f"shape {shown.shape}") from None
            return numpy.ascontiguousarray(shown)

        return cls(_Ext.from_stripes(batch, heads, len_q, len_k, block_size, stripe))

    @classmethod
    def from_dense(cls, mask, block_size=DEFAULT_BLOCK_SIZE):
        """mask: bool, [Lq, Lk], [H, Lq, Lk] or [B, H, Lq, Lk] (B or H of 1 broadcast)."""
        m = _arrays.as_array(mask, "mask", allow_bool=True)
        if _arrays.dtype_name(m) != "bool":
            raise Error(f"mask: expected dtype bool, given {_arrays.dtype_name(m)}")
        if not 2 <= m.ndim <= 4:
            raise Error(f"mask: expected 2 to 4 dims, given {m.ndim}")
        m4 = _arrays.reshape(m, (1,) * (4 - m.ndim) + _arrays.shape(m))
        return cls(_Ext.from_dense(_arrays.for_extension(_arrays.readable(m4)),
                                   _size(block_size, "block_size")))

    @classmethod
    def documents(cls, query_documents, key_documents=None, block_size=DEFAULT_BLOCK_SIZE):
        """Tokens attend only within their document (a packed batch): query_documents
        [Lq] or [B, Lq] and key_documents [Lk] or [B, Lk] (default: the queries') are a
        document id per position. Add causal=True for causal documents."""
        q = _integers(query_documents, "query_documents")
        k = q if key_documents is None else _integers(key_documents, "key_documents")
        if q.ndim not in (1, 2):
            raise Error(f"query_documents: expected [Lq] or [B, Lq], given shape {q.shape}")
        if k.ndim != q.ndim or (q.ndim == 2 and k.shape[0] != q.shape[0]):
            raise Error(f"key_documents: expected {'[Lk]' if q.ndim == 1 else '[B, Lk]'} as "
                        f"query_documents {q.shape}, given shape {k.shape}")
        batch = 1 if q.ndim == 1 else q.shape[0]
        return cls(_Ext.documents(q.reshape(-1).tolist(), k.reshape(-1).tolist(), batch,
                                  _size(block_size, "block_size")))

    @classmethod
    def prefix_lm(cls, prefix_lengths, len_q, len_k, block_size=DEFAULT_BLOCK_SIZE):
        """Bidirectional over the first prefix_lengths[b] keys, causal after them
        (query i sees key j when j < prefix or j <= i); prefix_lengths: an int or [B]."""
        lengths = numpy.atleast_1d(_integers(prefix_lengths, "prefix_lengths"))
        return cls(_Ext.prefix_lm(lengths.reshape(-1).tolist(), _size(len_q, "len_q"),
                                  _size(len_k, "len_k"), _size(block_size, "block_size")))

    @classmethod
    def chunked(cls, chunk, len_q, len_k, block_size=DEFAULT_BLOCK_SIZE):
        """Chunked local attention (Llama 4): query i sees key j when i // chunk ==
        j // chunk. Add causal=True for causal chunks."""
        return cls(_Ext.chunked(_size(chunk, "chunk"), _size(len_q, "len_q"),
                                _size(len_k, "len_k"), _size(block_size, "block_size")))

    @classmethod
    def window_and_global(cls, window, global_tokens, len_q, len_k,
                          block_size=DEFAULT_BLOCK_SIZE):
        """A sliding window with global tokens (Longformer): query i sees key j when
        |i - j| <= window, or when i or j is one of global_tokens."""
        tokens = numpy.atleast_1d(_integers(global_tokens, "global_tokens")).reshape(-1).tolist()
        window = _arrays.integer(window, "window", "an int of at least 0", low=0)
        return cls(_Ext.window_and_global(window, tokens, _size(len_q, "len_q"),
                                          _size(len_k, "len_k"), _size(block_size, "block_size")))

    @property
    def shape(self):
        """(batch, heads, len_q, len_k)."""
        e = self._ext
        return (e.batch, e.heads, e.len_q, e.len_k)

    @property
    def block_size(self):
        return self._ext.block_size

    @property
    def blocks(self):
        """(query blocks, key blocks) of each (batch entry, head)."""
        return (self._ext.query_blocks, self._ext.key_blocks)

    def block(self, b, h, qb, kb):
        """"empty", "full" or "partial"."""
        return self._ext.block(b, h, qb, kb)

    def count(self, kind):
        """Blocks of a kind ("empty", "full" or "partial") over every batch entry and head."""
        return self._ext.count(kind)

    def visible_fraction(self):
        """The share of blocks that are not empty: about the share of the dense work the
        kernels do."""
        return self._ext.visible_fraction()

    @property
    def nbytes(self):
        """Bytes the mask holds: a kind and an index per block, the partial blocks' bits."""
        return self._ext.nbytes

    def to_dense(self):
        """The pattern as a bool NumPy array [batch, heads, len_q, len_k]."""
        return self._ext.to_dense()

    def __repr__(self):
        return (f"attn.BlockMask(shape={self.shape}, block_size={self.block_size}, "
                f"empty={self.count('empty')}, full={self.count('full')}, "
                f"partial={self.count('partial')})")
