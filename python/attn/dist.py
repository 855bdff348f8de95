"""Attention over a sequence split across MPI processes (context parallelism): each rank of
an mpi4py communicator holds a shard of q, k and v, and attn.dist.attention gives it the
exact attention of its own query rows over the whole sequence (ring attention: K/V shards
travel around the ring of ranks while each rank computes on the one it holds).

    from mpi4py import MPI
    import attn.dist
    out = attn.dist.attention(q_local, k_local, v_local, comm=MPI.COMM_WORLD, causal=True,
                              sharding="zigzag")

`import attn` alone loads neither mpi4py nor MPI; `import attn.dist` imports mpi4py (which
initialises MPI) and needs it built against the system's Open MPI, the one attn._dist
links: pip install --no-binary=mpi4py mpi4py.
"""

from . import _arrays
from . import _request
from ._errors import ArgumentTypeError, Error

try:
    from . import _dist
except ModuleNotFoundError as error:
    if error.name != f"{__package__}._dist":
        raise
    raise ImportError(
        "attn.dist: this attn was built without MPI (attn._dist is missing); build it where "
        "CMake finds MPI (Debian: apt-get install libopenmpi-dev openmpi-bin)") from None
except ImportError as error:
    raise ImportError(
        f"attn.dist: attn._dist cannot load the MPI library it was built against ({error}); "
        "install the system's Open MPI (Debian: apt-get install openmpi-bin)") from error

try:
    from mpi4py import MPI
except ImportError as error:
    raise ImportError(
        f"attn.dist needs mpi4py ({error}), built against the system's MPI: "
        "pip install --no-binary=mpi4py mpi4py") from error


def _library_text(version):
    return version.rstrip("\0\n ")


# An MPI handle means the same communicator in both modules only when they share one libmpi.
if _library_text(MPI.Get_library_version()) != _library_text(_dist.library_version()):
    raise ImportError(
        f"attn.dist: mpi4py uses the MPI {_library_text(MPI.Get_library_version())!r}, but "
        f"attn._dist was built against {_library_text(_dist.library_version())!r}; build "
        "mpi4py against the system's MPI: pip install --no-binary=mpi4py mpi4py")

_SHARDINGS = ("contiguous", "zigzag")
_REFUSES = (("cu_seqlens_q", "packed sequences cannot be split over ranks"),
            ("cu_seqlens_k", "packed sequences cannot be split over ranks"))


def _handle(comm):
    """comm (an mpi4py intracommunicator) as the integer MPI_Comm handle attn._dist takes."""
    if not isinstance(comm, MPI.Intracomm):
        raise ArgumentTypeError(
            f"comm: expected an mpi4py MPI.Intracomm such as MPI.COMM_WORLD, given "
            f"{type(comm).__module__}.{type(comm).__qualname__}")
    if MPI.Is_finalized():
        raise Error("comm: expected a communicator of a running MPI, given one after MPI_Finalize")
    return MPI._handleof(comm)


def _agreed(comm, work):
    """work() on every rank of comm, and when it raises on some rank, the first such rank's
    exception on every rank, as "rank R: <message>" (the form of attn::dist's own checks):
    a rank that raised alone would leave the others waiting in the ring."""
    try:
        result, failure = work(), None
    except Exception as error:  # raised again below, on every rank
        result, failure = None, error
    rank, size = comm.Get_rank(), comm.Get_size()
    first = comm.allreduce(rank if failure is not None else size, op=MPI.MIN)
    if first == size:
        return result
    mine = (type(failure), str(failure)) if rank == first else None
    kind, message = comm.bcast(mine, root=first)
    raise kind(f"rank {first}: {message}") from failure


def attention(q_local, k_local, v_local, *, comm, sharding="contiguous", layout="bhsd",
              return_lse=False, **options):
    """Exact attention of this rank's query rows over the keys of every rank of comm: the
    rows of attn.attention(q, k, v, ...) on the whole sequence that q_local holds.

    Collective: every rank of comm calls it, with the same keywords, on its own shards.

    Shapes (layout="bhsd"; layout="bshd" swaps the L and H axes of q, k, v and out), with
    Lq_r, Lk_r this rank's rows of the global lengths Lq, Lk:
        q_local:  [Lq_r, D] | [Hq, Lq_r, D] | [B, Hq, Lq_r, D]
        k_local:  [Lk_r, D] | [Hkv, Lk_r, D] | [B, Hkv, Lk_r, D]   (Hq a multiple of Hkv)
        v_local:  [Lk_r, Dv] | [Hkv, Lk_r, Dv] | [B, Hkv, Lk_r, Dv]
        out:  like q_local with D replaced by Dv, in q_local's dtype and layout
        lse:  [Lq_r] | [Hq, Lq_r] | [B, Hq, Lq_r] (any layout), float32 (float64 for float64)
    B, the heads, D, Dv and the dtypes are the same on every rank. Inputs are NumPy arrays,
    torch tensors (CPU) or other DLPack producers in float16, bfloat16, float32 or float64,
    as for attn.attention; outputs are NumPy arrays, or torch tensors when q_local is one.

    Keywords (every default means "off"; all apply to the global sequence):
        comm: an mpi4py intracommunicator (MPI.COMM_WORLD, or one made from it).
        sharding: how the global sequence is split over the ranks of comm, for q and for k
            and v alike. "contiguous": rank r holds the r-th run of rows, of any length
            (the runs in rank order make the sequence; a run may be empty). "zigzag": the
            sequence is cut into 2N equal chunks and rank r of N holds chunks r and
            2N - 1 - r, in that order, so each rank's row count is even and the same on
            every rank, and causal work is even across ranks.
        layout, return_lse and the options below: as for attn.attention, over the global
            positions (threads per rank; position_offset moves the whole sequence). A mask
            and packed sequences (cu_seqlens) cannot be split over ranks and are not
            accepted; neither are gradients (no autograd).

    Results equal attn.attention on the whole sequence up to float32 rounding and are the
    same bytes on every run. The GIL is released while the ring runs.

    Bad input on any rank raises on every rank, the same exception with the same message
    "rank R: ..." (R the first rank that failed), as ValueError (attn.Error) or TypeError
    (attn.ArgumentTypeError) naming the argument; only a comm that is no communicator
    raises on its own rank alone (there is nothing to agree over).

    Returns out, or (out, lse) with return_lse=True.
    """
    handle = _handle(comm)

    def checked():
        if sharding not in _SHARDINGS:
            raise Error(f"sharding: expected 'contiguous' or 'zigzag', given {sharding!r}")
        prepared = _request.prepare(
            q_local, (("k_local", k_local), ("v_local", v_local)), layout, options,
            "attn.dist.attention", q_name="q_local", refused=_REFUSES)
        return prepared, _arrays.flag(return_lse, "return_lse")

    (q, (k, v), o, layout_view), want_lse = _agreed(comm, checked)
    rank = q.ndim
    q4, k4, v4 = (layout_view(x) for x in (q, k, v))
    ext = _request.ext
    context4, lse4 = _dist.forward(handle, ext(q4), ext(k4), ext(v4),
                                   zigzag=sharding == "zigzag", options=o)
    batch, heads, rows, dim_v = context4.shape
    out = _arrays.empty(q, _request.user_shape(context4.shape, rank, layout), _arrays.dtype_name(q))
    _request.to_bhsd(out, layout)[...] = _arrays.from_extension(context4, q)
    if not want_lse:
        return out
    lse = _arrays.like_kind(lse4.reshape((batch, heads, rows)[4 - rank :]), q)
    return out, lse


attention.__doc__ += _request.OPTIONS_DOC

__all__ = ["attention"]
