# Type stubs for attn.dist (dist.py). Arrays as in __init__.pyi: NumPy arrays, torch tensors
# (CPU) or other DLPack producers; outputs are NumPy arrays, or torch tensors when one went in.
from typing import Any, Literal, Tuple, overload

from mpi4py import MPI
from typing_extensions import Unpack

from ._request import OptionKeywords

Array = Any  # numpy.ndarray | torch.Tensor | a DLPack producer

__all__: list[str]

@overload
def attention(
    q_local: Array, k_local: Array, v_local: Array, *, comm: MPI.Intracomm,
    sharding: Literal["contiguous", "zigzag"] = "contiguous",
    layout: Literal["bhsd", "bshd"] = "bhsd", return_lse: Literal[False] = False,
    **options: Unpack[OptionKeywords],
) -> Array:
    """This rank's rows out [B, Hq, Lq_r, Dv] (or the input's rank/layout) of attention over
    the keys of every rank of comm."""
@overload
def attention(
    q_local: Array, k_local: Array, v_local: Array, *, comm: MPI.Intracomm,
    sharding: Literal["contiguous", "zigzag"] = "contiguous",
    layout: Literal["bhsd", "bshd"] = "bhsd", return_lse: Literal[True],
    **options: Unpack[OptionKeywords],
) -> Tuple[Array, Array]:
    """(out, lse [B, Hq, Lq_r]) for this rank's rows."""
