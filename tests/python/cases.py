"""Test cases are data, as in tests/support/cases.hpp: one Case with a readable name, a
list built by loops over shapes and options (awkward sizes included), random inputs made
for a case, and one comparison (NaN/inf checks, then NMSE and max abs error)."""

import dataclasses
import os

import ml_dtypes
import numpy as np

import numpy_reference


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int = 1
    heads_q: int = 1
    heads_kv: int = 1
    len_q: int = 1
    len_k: int = 1
    dim: int = 1
    dim_v: int = 1
    causal: bool = False
    bottom_right: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    sinks: bool = False
    mask: str = "none"  # "none", "bool" or "float"
    packed: bool = False  # each head's rows split into uneven packed sequences (B = 1)
    dtype: str = "float32"
    layout: str = "bhsd"
    rank: int = 4  # 2: [L, D]; 3: [H, L, D] or [L, H, D]; 4: batched

    @property
    def name(self):
        text = (f"B{self.batch}_H{self.heads_q}x{self.heads_kv}_Lq{self.len_q}_Lk{self.len_k}"
                f"_D{self.dim}")
        if self.dim_v != self.dim:
            text += f"_Dv{self.dim_v}"
        if self.causal:
            text += "_causalBR" if self.bottom_right else "_causalTL"
        elif self.bottom_right:
            text += "_alignBR"
        if self.window != (-1, -1):
            text += f"_win{self.window[0]}_{self.window[1]}"
        if self.softcap:
            text += f"_softcap{self.softcap:g}"
        for flag in ("alibi", "sinks", "packed"):
            if getattr(self, flag):
                text += "_" + flag
        if self.mask != "none":
            text += f"_{self.mask}mask"
        if self.dtype != "float32":
            text += "_" + self.dtype
        if self.layout != "bhsd":
            text += "_" + self.layout
        if self.rank != 4:
            text += f"_rank{self.rank}"
        return text


def _option_cases(shape):
    """Every option on its own, then a few together, on one shape."""
    base = Case(*shape)
    edits = [
        {},
        dict(causal=True),
        dict(causal=True, bottom_right=True),
        dict(window=(4, 0)),
        dict(window=(3, 5), bottom_right=True),
        dict(softcap=5.0),
        dict(alibi=True),
        dict(sinks=True),
        dict(mask="bool"),
        dict(mask="float"),
        dict(layout="bshd"),
        dict(dtype="float16"),
        dict(dtype="bfloat16"),
        dict(dtype="float64"),
        dict(causal=True, bottom_right=True, window=(6, -1), softcap=3.0, alibi=True,
             sinks=True, mask="float"),
        dict(causal=True, softcap=8.0, alibi=True, mask="bool", layout="bshd"),
    ]
    if base.batch == 1:
        edits += [
            dict(packed=True),
            dict(packed=True, causal=True, bottom_right=True, layout="bshd"),
            dict(rank=3),
            dict(rank=3, layout="bshd", causal=True),
        ]
    if base.batch == 1 and base.heads_q == 1 and base.heads_kv == 1:
        edits.append(dict(rank=2, mask="bool"))
    return [dataclasses.replace(base, **edit) for edit in edits]


# (batch, heads_q, heads_kv, len_q, len_k, dim, dim_v): awkward sizes 1, 3, 17, 97, GQA,
# MQA, Lq != Lk both ways, Dv != D. Kept small: attn may run its float64 reference.
_QUICK_SHAPES = [
    (2, 4, 2, 17, 17, 8, 8),
    (1, 2, 2, 3, 97, 5, 5),
    (1, 3, 1, 97, 17, 16, 16),
    (2, 2, 1, 1, 33, 12, 3),
    (1, 2, 1, 17, 1, 1, 3),
    (1, 1, 1, 1, 1, 1, 1),
    (1, 1, 1, 17, 3, 4, 4),
]


def narrow_row_cases():
    """Rows the dot micro-kernel scores (3 or 2 rows per KV head: at most half a vector on
    SSE4, AVX2 and AVX-512) at head dims 17 to 31, so that every tail length dim % 16 from 1
    to 15 is reached, in every dtype (tests/support/cases.cpp's twin)."""
    out = []
    for tail in range(1, 16):
        for dtype in ("float32", "float16", "bfloat16"):
            dim = 16 + tail
            out.append(Case(1, 2, 2, 3, 97, dim, dim, causal=tail % 2 == 1,
                            bottom_right=tail % 2 == 1, dtype=dtype))
            out.append(Case(1, 2, 1, 1, 97, dim, dim, dtype=dtype))
    return out


def case_list():
    """The quick list, or a wider sweep when ATTN_FULL_SWEEP=1."""
    shapes = list(_QUICK_SHAPES)
    if os.environ.get("ATTN_FULL_SWEEP") == "1":
        shapes += [(1, 4, 2, lq, lk, d, d) for lq in (1, 3, 17, 97) for lk in (1, 3, 17, 97)
                   for d in (1, 40, 59)]
    return [c for shape in shapes for c in _option_cases(shape)]


NUMPY_DTYPES = {
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float32": np.float32,
    "float64": np.float64,
}


def random_array(rng, shape, dtype):
    return rng.standard_normal(shape).astype(NUMPY_DTYPES[dtype])


def _packed_offsets(total, parts, rng):
    """[0, ..., total]: `parts` uneven (possibly empty) sequences."""
    cuts = np.sort(rng.integers(0, total + 1, size=parts - 1))
    return [0, *map(int, cuts), total]


def make_inputs(case, seed=1):
    """Random inputs for a case: (q, k, v, kwargs for attn.attention, kwargs for the
    numpy reference with q, k, v as 4-D bhsd float64)."""
    rng = np.random.default_rng(seed)
    c = case
    q4 = random_array(rng, (c.batch, c.heads_q, c.len_q, c.dim), c.dtype)
    k4 = random_array(rng, (c.batch, c.heads_kv, c.len_k, c.dim), c.dtype)
    v4 = random_array(rng, (c.batch, c.heads_kv, c.len_k, c.dim_v), c.dtype)
    kwargs, ref = {}, {}
    if c.causal:
        kwargs["causal"] = ref["causal"] = True
    if c.bottom_right:
        kwargs["causal_align"] = "bottom-right"
        ref["bottom_right"] = True
    if c.window != (-1, -1):
        kwargs["window"] = ref["window"] = c.window
    if c.softcap:
        kwargs["softcap"] = ref["softcap"] = c.softcap
    if c.alibi:
        slopes = 2.0 ** -np.arange(1, c.heads_q + 1)
        kwargs["alibi_slopes"] = ref["alibi_slopes"] = slopes
    if c.sinks:
        sinks = rng.standard_normal(c.heads_q)
        kwargs["sinks"] = ref["sinks"] = sinks.astype(np.float32).astype(np.float64)
    if c.mask == "bool":
        mask = rng.random((c.batch, 1, c.len_q, c.len_k)) < 0.7
        mask[..., 0, :] = False  # one fully masked row per batch entry
        kwargs["mask"] = ref["mask"] = mask
    if c.mask == "float":
        mask = np.where(rng.random((1, c.heads_q, c.len_q, c.len_k)) < 0.2, -np.inf,
                        rng.standard_normal((1, c.heads_q, c.len_q, c.len_k)))
        kwargs["mask"] = ref["mask"] = mask.astype(np.float32)
    if c.packed:
        cu_q = _packed_offsets(c.len_q, 3, rng)
        cu_k = _packed_offsets(c.len_k, 3, rng)
        kwargs["cu_seqlens_q"] = ref["cu_seqlens_q"] = cu_q
        kwargs["cu_seqlens_k"] = ref["cu_seqlens_k"] = cu_k

    def user_form(x4):
        x = x4.transpose(0, 2, 1, 3).copy() if c.layout == "bshd" else x4
        if c.rank == 4:
            return x
        if c.rank == 3:
            return x[0]
        return x[0, 0] if c.layout == "bhsd" else x[0, :, 0]

    if c.layout != "bhsd":
        kwargs["layout"] = c.layout
    if c.rank != 4 and "mask" in kwargs:
        kwargs["mask"] = kwargs["mask"].reshape(kwargs["mask"].shape[4 - c.rank:])
    return user_form(q4), user_form(k4), user_form(v4), kwargs, (q4, k4, v4, ref)


# Per input dtype: (largest NMSE, largest max abs error over max(1, max |want|)) against
# float64. Loose enough for
# a float32-accumulating fast kernel, tight enough that a wrong mask or scale fails.
TOLERANCES = {
    "float64": (1e-12, 1e-5),
    "float32": (1e-10, 1e-5),
    "float16": (1e-5, 1e-2),
    "bfloat16": (3e-4, 6e-2),
}


def assert_close(got, want, dtype, what="output"):
    """got: any array; want: float64 of the same shape."""
    got = np.asarray(got).astype(np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN at {np.argwhere(np.isnan(got))[:5].tolist()}"
    inf_mismatch = np.isinf(got) != np.isinf(want)
    assert not inf_mismatch.any(), f"{what}: infinities differ at {np.argwhere(inf_mismatch)[:5].tolist()}"
    both_inf = np.isinf(want)
    assert (got[both_inf] == want[both_inf]).all(), f"{what}: infinities of the wrong sign"
    finite = ~both_inf
    diff = got[finite] - want[finite]
    max_nmse, max_abs = TOLERANCES[dtype]
    power = float(np.sum(want[finite] ** 2))
    nmse = float(np.sum(diff**2)) / power if power > 0 else float(np.sum(diff**2))
    # max abs error in units of the largest magnitude (at least 1): scores can be large
    magnitude = max(1.0, float(np.abs(want[finite]).max())) if diff.size else 1.0
    worst = float(np.abs(diff).max()) / magnitude if diff.size else 0.0
    assert nmse <= max_nmse and worst <= max_abs, (
        f"{what}: nmse {nmse:.3g} (limit {max_nmse:g}), max abs {worst:.3g} (limit {max_abs:g})"
    )


def reference_output(case, ref_inputs):
    """The numpy reference for a case, reshaped to the case's rank and layout."""
    q4, k4, v4, ref = ref_inputs
    out, lse, weights = numpy_reference.attention(q4, k4, v4, **ref)
    if case.layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    if case.rank == 3:
        out, lse, weights = out[0], lse[0], weights[0]
    if case.rank == 2:
        out = out[0, 0] if case.layout == "bhsd" else out[0, :, 0]
        lse, weights = lse[0, 0], weights[0, 0]
    return out, lse, weights
