# Type stubs for attn.dist (dist.py). Arrays as in __init__.pyi: NumPy arrays, torch tensors
# (CPU) or other DLPack producers; outputs are NumPy arrays, or torch tensors when one went in.
from typing import Any, Literal, Optional, Sequence, Tuple, Union, overload

from mpi4py import MPI

Array = Any  # numpy.ndarray | torch.Tensor | a DLPack producer
Numbers = Union[Sequence[float], Array]

__all__: list[str]

@overload
def attention(
    q_local: Array, k_local: Array, v_local: Array, *, comm: MPI.Intracomm, causal: bool = False,
    causal_align: Literal["top-left", "bottom-right"] = "top-left",
    scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: Optional[Numbers] = None, sinks: Optional[Numbers] = None,
    sharding: Literal["contiguous", "zigzag"] = "contiguous",
    layout: Literal["bhsd", "bshd"] = "bhsd", return_lse: Literal[False] = False,
    threads: Optional[int] = None,
) -> Array:
    """This rank's rows out [B, Hq, Lq_r, Dv] (or the input's rank/layout) of attention over
    the keys of every rank of comm."""
@overload
def attention(
    q_local: Array, k_local: Array, v_local: Array, *, comm: MPI.Intracomm, causal: bool = False,
    causal_align: Literal["top-left", "bottom-right"] = "top-left",
    scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: Optional[Numbers] = None, sinks: Optional[Numbers] = None,
    sharding: Literal["contiguous", "zigzag"] = "contiguous",
    layout: Literal["bhsd", "bshd"] = "bhsd", return_lse: Literal[True],
    threads: Optional[int] = None,
) -> Tuple[Array, Array]:
    """(out, lse [B, Hq, Lq_r]) for this rank's rows."""
