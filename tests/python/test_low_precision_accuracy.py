"""The accuracy contract of float16 and bfloat16 inputs: against the float64 reference on
the same (rounded) inputs, attn's output with float32 P (pv_precision="exact") is no less
accurate than PyTorch's own CPU kernel (torch.nn.functional.scaled_dot_product_attention)
in the same dtype: its NMSE at most torch's, its max abs error at most 1.25x torch's (the
largest errors of both are mostly the final rounding of the same element); with P rounded
to bf16 (the default) it is as accurate as torch, which rounds P the same way. Every kernel
path for these dtypes, whatever the CPU dispatches to, must keep to it."""

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attn  # noqa: E402
import numpy_reference  # noqa: E402

# (batch, query heads, kv heads, length, head dim): awkward sizes, GQA, two tile lengths.
SHAPES = [(2, 4, 2, 17, 17), (1, 2, 1, 97, 40), (1, 4, 4, 113, 59), (1, 4, 2, 256, 64),
          (1, 2, 2, 257, 128), (1, 8, 8, 1025, 64)]
DTYPES = [torch.bfloat16, torch.float16]


def _errors(got, want):
    diff = got - want
    return float(np.sum(diff * diff) / np.sum(want * want)), float(np.abs(diff).max())


def _inputs_and_errors(dtype, shape, causal, seed, **options):
    """q, k, v of the shape, attn's output with options, and the errors (NMSE, max abs) of
    attn's and of torch's against float64 on the same rounded inputs."""
    batch, heads_q, heads_kv, length, dim = shape
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, h, length, dim, generator=generator).to(dtype)
               for h in (heads_q, heads_kv, heads_kv))
    want, _, _ = numpy_reference.attention(q.double().numpy(), k.double().numpy(),
                                           v.double().numpy(), causal=causal)
    ours = attn.attention(q, k, v, causal=causal, **options)
    theirs = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=heads_q != heads_kv)
    return (q, k, v), ours, _errors(ours.double().numpy(), want), \
        _errors(theirs.double().numpy(), want)


@pytest.mark.parametrize("dtype, shape, causal", list(itertools.product(DTYPES, SHAPES, (False, True))),
                         ids=lambda x: str(x).replace("torch.", ""))
def test_exact_p_no_less_accurate_than_torch(dtype, shape, causal):
    _, ours, (ours_nmse, ours_max), (theirs_nmse, theirs_max) = _inputs_and_errors(
        dtype, shape, causal, seed=shape[3] * 7 + shape[4], pv_precision="exact")
    assert ours.dtype == dtype
    assert ours_nmse <= theirs_nmse, f"NMSE {ours_nmse:.3g} against torch's {theirs_nmse:.3g}"
    assert ours_max <= 1.25 * theirs_max, f"max abs {ours_max:.3g} against torch's {theirs_max:.3g}"


@pytest.mark.parametrize("dtype, shape, causal", list(itertools.product(DTYPES, SHAPES, (False, True))),
                         ids=lambda x: str(x).replace("torch.", ""))
def test_default_p_rounded_to_bf16_as_accurate_as_torch(dtype, shape, causal):
    """The default, pv_precision="bf16", rounds each weight to bfloat16 for P V where it runs
    on bf16 products (AMX tiles; vdpbf16ps for bf16 V without AMX where it pays), as
    PyTorch's kernel rounds P: for bf16 inputs the same algorithm's accuracy, NMSE within
    1.05x torch's (at most 1.007x over 48 runs on Zen 4, 1.010x on Emerald Rapids); fp16 V
    on AMX tiles takes two bf16 parts of each weight, since one left NMSE 17-27x torch's
    there (0.54-0.64x with two). Max abs error within 1.5x torch's (one more rounding of the
    same size as the output's own). Where P V does not run on bf16 products it changes no bit."""
    (q, k, v), ours, (ours_nmse, ours_max), (theirs_nmse, theirs_max) = _inputs_and_errors(
        dtype, shape, causal, seed=shape[3] * 5 + shape[4])
    if "pv_precision bf16" not in attn.explain(q, k, v, causal=causal)["plan"]:
        assert torch.equal(ours, attn.attention(q, k, v, causal=causal, pv_precision="exact"))
    assert ours_nmse <= 1.05 * theirs_nmse, \
        f"NMSE {ours_nmse:.3g} against torch's {theirs_nmse:.3g}"
    assert ours_max <= 1.5 * theirs_max, f"max abs {ours_max:.3g} against torch's {theirs_max:.3g}"
