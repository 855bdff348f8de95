"""attn.scaled_dot_product_attention against the float64 NumPy reference, with PyTorch's
semantics: [..., L, E] shapes, bool masks (True = attend) or float masks (added),
is_causal top-left, GQA only with enable_gqa."""

import dataclasses

import numpy as np
import pytest

import attn
import numpy_reference
from cases import assert_close, random_array


@dataclasses.dataclass(frozen=True)
class SdpaCase:
    lead_q: tuple  # leading dims of query: (..., Hq)
    lead_kv: tuple
    len_q: int
    len_k: int
    dim: int
    dim_v: int
    mask: str = "none"  # "none", "bool", "float"
    mask_shape: str = "full"  # "full", "2d" ([L, S]), "keys" ([..., 1, S] padding)
    is_causal: bool = False
    enable_gqa: bool = False
    scale: float = None
    dtype: str = "float32"

    @property
    def name(self):
        text = f"q{self.lead_q}_kv{self.lead_kv}_L{self.len_q}_S{self.len_k}_E{self.dim}_Ev{self.dim_v}"
        if self.mask != "none":
            text += f"_{self.mask}mask_{self.mask_shape}"
        text += "_causal" * self.is_causal + "_gqa" * self.enable_gqa
        if self.scale is not None:
            text += f"_scale{self.scale:g}"
        return (text + "_" + self.dtype).replace(" ", "").replace(",)", ")")


def _sdpa_cases():
    shapes = [((2, 3), (2, 3), 17, 17, 8, 8), ((1, 2), (1, 2), 3, 97, 5, 7),
              ((4,), (4,), 97, 3, 16, 16), ((), (), 1, 1, 1, 1), ((2, 1, 2), (2, 1, 2), 5, 9, 4, 4)]
    out = []
    for lead_q, lead_kv, lq, lk, d, dv in shapes:
        base = SdpaCase(lead_q, lead_kv, lq, lk, d, dv)
        out += [base, dataclasses.replace(base, is_causal=True), dataclasses.replace(base, scale=0.3)]
        for mask in ("bool", "float"):
            for shape in ("full", "2d", "keys"):
                out.append(dataclasses.replace(base, mask=mask, mask_shape=shape))
        out += [dataclasses.replace(base, dtype=t) for t in ("float16", "bfloat16", "float64")]
    gqa = [((2, 4), (2, 2), 17, 33, 8, 8), ((6,), (1,), 3, 17, 4, 4), ((1, 2, 6), (1, 2, 3), 9, 9, 4, 4)]
    for lead_q, lead_kv, lq, lk, d, dv in gqa:
        base = SdpaCase(lead_q, lead_kv, lq, lk, d, dv, enable_gqa=True)
        out += [base, dataclasses.replace(base, is_causal=True),
                dataclasses.replace(base, mask="bool", mask_shape="keys")]
    return out


CASES = _sdpa_cases()


def make_sdpa_inputs(case, seed=3):
    rng = np.random.default_rng(seed)
    q = random_array(rng, case.lead_q + (case.len_q, case.dim), case.dtype)
    k = random_array(rng, case.lead_kv + (case.len_k, case.dim), case.dtype)
    v = random_array(rng, case.lead_kv + (case.len_k, case.dim_v), case.dtype)
    mask = None
    if case.mask != "none":
        shape = {"full": case.lead_q + (case.len_q, case.len_k), "2d": (case.len_q, case.len_k),
                 "keys": case.lead_q[:-1] + (1,) * bool(case.lead_q) + (1, case.len_k)}[case.mask_shape]
        if case.mask == "bool":
            mask = rng.random(shape) < 0.75
        else:
            mask = np.where(rng.random(shape) < 0.2, -np.inf, rng.standard_normal(shape))
            mask = mask.astype(np.float32)
    return q, k, v, mask


def sdpa_reference(case, q, k, v, mask):
    """PyTorch's definition in float64 through the attention reference, with the leading
    dims flattened into [B, H]."""
    lead = case.lead_q
    batch = int(np.prod(lead[:-1])) if lead else 1
    def to4(x):
        return np.asarray(x, np.float64).reshape((batch, -1) + x.shape[-2:])
    full_mask = None
    if mask is not None:
        full_mask = np.broadcast_to(mask, lead + (case.len_q, case.len_k)).reshape(
            (batch, -1, case.len_q, case.len_k))
    out, _, _ = numpy_reference.attention(to4(q), to4(k), to4(v), mask=full_mask,
                                          causal=case.is_causal, scale=case.scale)
    return out.reshape(lead + (case.len_q, case.dim_v))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_sdpa_matches_reference(case):
    q, k, v, mask = make_sdpa_inputs(case)
    got = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=case.is_causal,
                                            scale=case.scale, enable_gqa=case.enable_gqa)
    assert got.dtype == q.dtype
    assert_close(got, sdpa_reference(case, q, k, v, mask), case.dtype)


def test_is_causal_is_top_left_when_lengths_differ():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 3, 4))
    k = rng.standard_normal((1, 5, 4))
    got = attn.scaled_dot_product_attention(q, k, k, is_causal=True)
    top_left = np.tril(np.ones((3, 5), bool))  # query i sees keys 0..i
    np.testing.assert_allclose(got, attn.scaled_dot_product_attention(q, k, k, attn_mask=top_left),
                               rtol=0, atol=0)
    bottom_right = attn.attention(q, k, k, causal=True, causal_align="bottom-right")
    assert not np.allclose(got, bottom_right)


def test_fully_masked_rows_are_zeros():
    q = np.ones((2, 3, 4), np.float32)
    mask = np.ones((3, 3), bool)
    mask[2] = False
    out = attn.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert (out[:, 2] == 0).all() and np.isfinite(out).all()


def test_gqa_needs_enable_gqa():
    q = np.zeros((4, 3, 8), np.float32)
    kv = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match="heads may differ only with enable_gqa=True"):
        attn.scaled_dot_product_attention(q, kv, kv)
    assert attn.scaled_dot_product_attention(q, kv, kv, enable_gqa=True).shape == (4, 3, 8)


def test_is_causal_with_a_mask_is_refused():
    q = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="attn_mask"):
        attn.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((2, 2), bool), is_causal=True)
