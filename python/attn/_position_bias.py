"""attn.PositionBias: a learned additive score bias by relative position (attn/position_bias.hpp),
T5's bucketed table or a table over clipped distances, given to attn.attention, attn.weights
and attn.attention_backward as the position_bias option."""

import numpy

from . import _arrays
from ._attn import bias_columns as _bias_columns
from ._errors import ArgumentTypeError, Error

BUCKETS = ("clipped", "t5", "t5_causal")


class PositionBias:
    """score += table[head, column(query position - key position)], inside the kernels (no
    [Lq, Lk] array), after softcap and ALiBi; positions are those causal and ALiBi use
    (causal_align, position_offset).

    table: [columns] (one row for every head) or [Hq, columns] numbers: a NumPy array, a
        list or a torch tensor. A tensor that requires grad gets its gradient through
        autograd (attn.attention); attn.attention_backward returns it as dposition_bias.
    buckets: how a distance d = query position - key position picks its column:
        "clipped": column clamp(d + offset, 0, columns - 1), each distance its own column
            (Shaw et al.; FlexAttention's score + bias[h, q_idx - kv_idx] with offset
            columns // 2 or, under causal, 0);
        "t5": T5's bidirectional buckets (the encoder's, relative_attention_bias with
            bidirectional=True, num_buckets=columns, max_distance);
        "t5_causal": T5's one-directional buckets (the decoder's).
    offset: "clipped" only: the column of distance 0.
    max_distance: "t5" and "t5_causal": the distance from which all share the last bucket.
    """

    def __init__(self, table, buckets="clipped", *, offset=0, max_distance=128):
        if buckets not in BUCKETS:
            raise Error(f"position_bias.buckets: expected 'clipped', 't5' or 't5_causal', "
                        f"given {buckets!r}")
        shape = tuple(_arrays.shape(table)) if hasattr(table, "shape") else numpy.shape(table)
        if len(shape) not in (1, 2) or shape[-1] < 1:
            raise Error(f"position_bias.table: expected [columns] or [Hq, columns] with "
                        f"columns >= 1, given shape {list(shape)}")
        self.table = table
        self.shape = shape
        self.buckets = buckets
        self.offset = _arrays.integer(offset, "position_bias.offset", "an int")
        self.max_distance = _arrays.integer(max_distance, "position_bias.max_distance", "an int")
        self.columns = int(shape[-1])
        self.columns_of([0])  # the settings' checks, now rather than at the first call

    def columns_of(self, distances):
        """The column each distance (query position - key position, any int array) reads,
        as a NumPy int64 array of its shape."""
        array = numpy.asarray(distances)
        if array.dtype == object or array.dtype.kind not in "iu":
            raise ArgumentTypeError(f"distances: expected integers, given dtype {array.dtype}")
        flat = [int(d) for d in array.reshape(-1)]
        found = _bias_columns(self.buckets, self.columns, self.offset, self.max_distance, flat)
        return numpy.asarray(found, dtype=numpy.int64).reshape(array.shape)

    def values(self):
        """The table as a flat list of floats (row-major), read without a gradient."""
        table = self.table
        if _arrays.is_torch(table):
            table = table.detach().cpu().double().numpy()
        array = numpy.asarray(table)
        if array.dtype == object or array.dtype.kind not in "iuf":
            raise ArgumentTypeError(f"position_bias.table: expected numbers, given dtype "
                                    f"{array.dtype}")
        return [float(x) for x in array.astype(numpy.float64).reshape(-1)]

    def __repr__(self):
        return (f"PositionBias(columns={self.columns}, buckets={self.buckets!r}, "
                f"offset={self.offset}, max_distance={self.max_distance})")
