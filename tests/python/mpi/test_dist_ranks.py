"""attn.dist.attention on every rank of the MPI job that tests/python/test_dist.py starts
(mpirun -np 1 to 4; a plain pytest run of tests/python leaves this folder out). Each rank
builds the same global inputs from the same seed (tests/python/cases.py), passes its shard,
gathers every rank's rows and compares the whole with single-process attn.attention. Each
test makes all its collective calls before it asserts anything, so that a failure on one
rank cannot leave the others waiting; a hang is the launcher's timeout."""

import ast
import dataclasses
import inspect
import pathlib

import numpy as np
import pytest
from mpi4py import MPI

import attn
import attn.dist
from cases import NUMPY_DTYPES, Case, case_list, make_inputs

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


@dataclasses.dataclass(frozen=True)
class DistCase:
    case: Case
    sharding: str

    @property
    def name(self):
        return f"{self.case.name}_{self.sharding}"


def dist_cases():
    """The quick case list without what cannot be split (a mask, packed sequences), each
    contiguous, and zigzag (lengths rounded up to a multiple of 2N) where positions matter;
    and a rank-2 case and one of more rows than a rank computes in one block (512)."""
    out, names = [], set()
    extra = [Case(1, 1, 1, 17, 9, 4, 4, causal=True, rank=2),
             Case(1, 1, 1, 1100, 1100, 8, 8, causal=True, window=(700, -1))]
    for c in case_list() + extra:
        if c.mask != "none" or c.packed:
            continue
        out.append(DistCase(c, "contiguous"))
        if not c.causal and c.window == (-1, -1) and not c.alibi:
            continue
        step = 2 * SIZE
        zigzag = dataclasses.replace(c, len_q=-(-c.len_q // step) * step,
                                     len_k=-(-c.len_k // step) * step)
        if zigzag.name not in names:  # rounding up can make two lengths one
            names.add(zigzag.name)
            out.append(DistCase(zigzag, "zigzag"))
    return out


def pieces(sharding, length, rank, keys):
    """(first, count) runs of the global rows that `rank` holds: zigzag chunks r and
    2N - 1 - r; contiguous runs even for queries, growing with r for keys (the first ranks'
    runs of a short sequence empty), as in tests/dist/dist_test.cpp."""
    if sharding == "zigzag":
        chunk = length // (2 * SIZE)
        return [(rank * chunk, chunk), ((2 * SIZE - 1 - rank) * chunk, chunk)]
    def boundary(r):
        return length * r * r // (SIZE * SIZE) if keys else length * r // SIZE

    return [(boundary(rank), boundary(rank + 1) - boundary(rank))]


def sequence_axis(case):
    return -2 if case.layout == "bhsd" or case.rank == 2 else -3


def shard(x, runs, axis):
    """The runs of x along axis: a view for one run (read in place), else a copy."""
    index = (slice(None),) * (x.ndim + axis)
    parts = [x[index + (slice(first, first + count),)] for first, count in runs]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis)


def gathered(local, runs, length, axis):
    """Every rank's rows (local: this rank's, as float64) put back in global order."""
    everyone = COMM.allgather((local, runs))
    shape = list(local.shape)
    shape[axis] = length
    whole = np.full(shape, np.nan)
    for rows, rank_runs in everyone:
        at = 0
        for first, count in rank_runs:
            index = (slice(None),) * (len(shape) + axis)
            whole[index + (slice(first, first + count),)] = rows[index + (slice(at, at + count),)]
            at += count
    return whole


def sharded(dc):
    """dc's global inputs and keywords, this rank's shards of them, and its query runs."""
    c = dc.case
    q, k, v, kwargs, _ = make_inputs(c)
    # float32 P, so that both sides round only their float32 contexts: with P rounded to bf16
    # (the default) each block rounds weights against its own running maximum.
    kwargs["pv_precision"] = "exact"
    axis = sequence_axis(c)
    q_runs = pieces(dc.sharding, c.len_q, RANK, keys=False)
    k_runs = pieces(dc.sharding, c.len_k, RANK, keys=True)
    shards = shard(q, q_runs, axis), shard(k, k_runs, axis), shard(v, k_runs, axis)
    return (q, k, v), kwargs, shards, q_runs


def assert_matches(got, want, dtype, what):
    """got: attn.dist's float64 image; want: single-process attn.attention's, the same dtype.
    float32 and float64: to their rounding (the blocks' states merge in another order than
    one kernel's tiles). float16 and bfloat16: both round a float32 context, so at most
    neighbours in the half dtype (2^-10 |want| apart for float16, 2^-7 for bfloat16, or
    2^-20 near zero, where float32's own error spans several float16 subnormals)."""
    want = np.asarray(want).astype(np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN at {np.argwhere(np.isnan(got))[:5].tolist()}"
    infinite = np.isinf(want)
    assert (np.isinf(got) == infinite).all() and (got[infinite] == want[infinite]).all(), what
    got, want = got[~infinite], want[~infinite]
    if not want.size:
        return
    if dtype in ("float16", "bfloat16") and what == "out":
        relative = 2.0**-10 if dtype == "float16" else 2.0**-7
        steps = np.abs(got - want) / np.maximum(relative * np.abs(want), 2.0**-20)
        assert steps.max() <= 1.0, f"{what}: {steps.max():.3g} half-dtype steps apart"
        return
    bound = (1e-12 if dtype == "float64" else 1e-5) * max(1.0, float(np.abs(want).max()))
    worst = float(np.abs(got - want).max())
    assert worst <= bound, f"{what}: max abs difference {worst:.3g} (bound {bound:.3g})"


CASES = dist_cases()


@pytest.mark.parametrize("dc", CASES, ids=[dc.name for dc in CASES])
def test_the_ranks_rows_make_single_process_attention(dc):
    (q, k, v), kwargs, shards, q_runs = sharded(dc)
    out, lse = attn.dist.attention(*shards, comm=COMM, sharding=dc.sharding, return_lse=True,
                                   **kwargs)
    axis = sequence_axis(dc.case)
    whole_out = gathered(np.asarray(out).astype(np.float64), q_runs, dc.case.len_q, axis)
    whole_lse = gathered(np.asarray(lse).astype(np.float64), q_runs, dc.case.len_q, -1)

    assert out.dtype == NUMPY_DTYPES[dc.case.dtype]
    assert lse.dtype == (np.float64 if dc.case.dtype == "float64" else np.float32)
    assert out.flags.c_contiguous  # in the caller's layout, as attn.attention gives it
    want_out, want_lse = attn.attention(q, k, v, return_lse=True, **kwargs)
    assert_matches(whole_out, want_out, dc.case.dtype, "out")
    assert_matches(whole_lse, want_lse, dc.case.dtype, "lse")


def test_a_second_run_gives_the_same_bytes_and_out_alone_is_the_same():
    dc = DistCase(Case(2, 4, 2, 8 * SIZE, 8 * SIZE, 8, 8, causal=True, alibi=True, sinks=True),
                  "zigzag")
    _, kwargs, shards, _ = sharded(dc)
    keywords = dict(comm=COMM, sharding="zigzag", **kwargs)
    out, lse = attn.dist.attention(*shards, return_lse=True, **keywords)
    again, again_lse = attn.dist.attention(*shards, return_lse=True, **keywords)
    alone = attn.dist.attention(*shards, **keywords)
    assert out.tobytes() == again.tobytes() and lse.tobytes() == again_lse.tobytes()
    assert isinstance(alone, np.ndarray) and alone.tobytes() == out.tobytes()


def test_torch_tensors_in_give_torch_tensors_out():
    if SIZE != 2:
        pytest.skip("importing torch takes seconds per rank: checked on 2 ranks only")
    import torch
    dc = DistCase(Case(1, 2, 1, 12, 12, 8, 8, causal=True, layout="bshd"), "zigzag")
    (q, k, v), kwargs, shards, q_runs = sharded(dc)
    out, lse = attn.dist.attention(*(torch.from_numpy(np.ascontiguousarray(x)) for x in shards),
                                   comm=COMM, sharding="zigzag", return_lse=True, **kwargs)
    want, want_lse = attn.dist.attention(*shards, comm=COMM, sharding="zigzag", return_lse=True,
                                         **kwargs)
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert out.numpy().tobytes() == want.tobytes() and lse.numpy().tobytes() == want_lse.tobytes()


def every_rank_raises(call):
    """(type name, message) of what call raised, as every rank saw it."""
    try:
        call()
        seen = ("nothing", "")
    except Exception as error:
        seen = (type(error).__name__, str(error))
    return COMM.allgather(seen)


def small_inputs(dim=8, dtype=np.float32):
    rng = np.random.default_rng(RANK)
    return [rng.standard_normal((2, 4, dim)).astype(dtype) for _ in range(3)]


def test_a_bad_sharding_raises_on_every_rank():
    seen = every_rank_raises(lambda: attn.dist.attention(*small_inputs(), comm=COMM,
                                                         sharding="diagonal"))
    want = ("Error", "rank 0: sharding: expected 'contiguous' or 'zigzag', given 'diagonal'")
    assert seen == [want] * SIZE


def test_a_bad_argument_on_the_last_rank_only_raises_on_every_rank():
    """The Python side's checks are agreed too: the last rank's own mistake, its type and
    message, on every rank, and no rank left waiting in the ring."""
    last = SIZE - 1
    sharding = "nonsense" if RANK == last else "contiguous"
    seen = every_rank_raises(lambda: attn.dist.attention(*small_inputs(), comm=COMM,
                                                         sharding=sharding))
    want = ("Error", f"rank {last}: sharding: expected 'contiguous' or 'zigzag', given 'nonsense'")
    q, k, v = small_inputs()
    k_bad = k.astype(np.int32) if RANK == last else k
    seen_type = every_rank_raises(lambda: attn.dist.attention(q, k_bad, v, comm=COMM))
    assert seen == [want] * SIZE
    want_type = ("ArgumentTypeError", f"rank {last}: k_local: expected dtype float16, bfloat16, "
                 "float32 or float64, given int32")
    assert seen_type == [want_type] * SIZE
    assert issubclass(attn.ArgumentTypeError, TypeError) and issubclass(attn.Error, ValueError)


def test_head_dims_that_differ_across_ranks_raise_the_same_on_every_rank():
    if SIZE < 2:
        pytest.skip("needs two ranks to differ")
    inputs = small_inputs(dim=8 if RANK == 0 else 16)
    seen = every_rank_raises(lambda: attn.dist.attention(*inputs, comm=COMM, causal=True))
    assert seen == [("Error", "rank 1: q head dim: expected 8 (as on rank 0), given 16")] * SIZE


def test_zigzag_needs_an_even_row_count_on_every_rank():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 8)).astype(np.float32) for _ in range(3))
    seen = every_rank_raises(lambda: attn.dist.attention(q, k, v, comm=COMM, sharding="zigzag"))
    assert seen == [("Error", "rank 0: q_local: expected an even row count (two equal zigzag "
                              "chunks), given shape [1, 2, 3, 8]")] * SIZE


@pytest.mark.parametrize("comm", [None, 0, "world", MPI.COMM_NULL],
                         ids=["None", "int", "str", "COMM_NULL"])
def test_comm_must_be_an_mpi4py_intracommunicator(comm):
    with pytest.raises(TypeError, match=r"^comm: expected an mpi4py MPI.Intracomm"):
        attn.dist.attention(*small_inputs(), comm=comm)


@pytest.mark.parametrize("keyword", ["mask", "cu_seqlens_q", "cu_seqlens_k"])
def test_a_mask_and_packed_sequences_are_no_keywords(keyword):
    with pytest.raises(TypeError, match=keyword):
        attn.dist.attention(*small_inputs(), comm=COMM, **{keyword: None})


def test_a_subcommunicator_of_one_rank_attends_alone():
    """Each rank in a communicator of its own (MPI.COMM_SELF): single-process attention."""
    q, k, v = small_inputs()
    out = attn.dist.attention(q, k, v, comm=MPI.COMM_SELF, causal=True)
    assert np.abs(out - attn.attention(q, k, v, causal=True)).max() <= 1e-6


def test_the_stub_matches_the_function():
    tree = ast.parse(pathlib.Path(attn.dist.__file__).with_suffix(".pyi").read_text())
    stubs = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert {node.name for node in stubs} == set(attn.dist.__all__) == {"attention"}
    params = inspect.signature(attn.dist.attention).parameters.values()
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    keyword = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    for node in stubs:
        assert [p.arg for p in node.args.args] == positional
        assert [p.arg for p in node.args.kwonlyargs] == keyword
