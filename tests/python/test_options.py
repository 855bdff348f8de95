"""The options every entry point shares (attn/_request.py): one attn._attn.Options, built
from the same keywords for attention, weights, attention_backward, attention_state, decode
and attn.dist.attention; position_offset among them; which backend runs, said before
(attn.explain) and, for a fallback to the float64 reference, once (attn.FallbackWarning)."""

import subprocess
import sys

import numpy as np
import pytest

import attn


def _inputs(dtype=np.float32, heads=2, len_q=40, len_k=40, dim=16, seed=3):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, len_q, dim)).astype(dtype)
    k = rng.standard_normal((heads, len_k, dim)).astype(dtype)
    v = rng.standard_normal((heads, len_k, dim)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_position_offset_places_a_chunk_of_queries_in_the_whole(align):
    """A chunk of a prompt's queries, moved by position_offset to where it sits, gives the
    rows the whole prompt gives: in attention, its weights, its state and its gradients."""
    q, k, v = _inputs()
    whole = attn.attention(q, k, v, causal=True, window=(9, 0), alibi_slopes=[0.5, 0.25],
                           return_lse=True)
    start, end = 13, 31
    # bottom-right puts the chunk's last query at the last key; the offset moves it back
    offset = start if align == "top-left" else start - (q.shape[1] - (end - start))
    keywords = dict(causal=True, causal_align=align, window=(9, 0), alibi_slopes=[0.5, 0.25],
                    position_offset=offset)
    out, lse = attn.attention(q[:, start:end], k, v, return_lse=True, **keywords)
    np.testing.assert_allclose(out, whole[0][:, start:end], rtol=0, atol=2e-6)
    np.testing.assert_allclose(lse, whole[1][:, start:end], rtol=0, atol=2e-6)
    weights = attn.weights(q[:, start:end], k, **keywords)
    np.testing.assert_allclose(weights, attn.weights(q, k, causal=True, window=(9, 0),
                                                     alibi_slopes=[0.5, 0.25])[:, start:end],
                               rtol=0, atol=2e-6)
    state = attn.attention_state(q[None, :, start:end], k[None], v[None], **keywords)
    state_out, _ = attn.finalize(state)
    np.testing.assert_allclose(state_out[0], out, rtol=0, atol=2e-6)
    dout = np.ones_like(out)
    dq, _, _ = attn.attention_backward(q[:, start:end], k, v, out, lse, dout, **keywords)
    assert np.all(np.isfinite(dq))


def test_position_offset_is_checked_in_core():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="position_offset: expected a magnitude below 2"):
        attn.attention(q, k, v, position_offset=2**31)
    with pytest.raises(TypeError, match="position_offset: expected an int"):
        attn.attention(q, k, v, position_offset=1.5)


def test_an_unknown_keyword_is_named():
    q, k, v = _inputs()
    with pytest.raises(TypeError, match="unexpected keyword argument 'casual'"):
        attn.attention(q, k, v, casual=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dropout'"):
        attn.weights(q, k, dropout=0.1)


@pytest.mark.parametrize("function, keyword", [
    (lambda q, k, v, **kw: attn.attention_state(q[None], k[None], v[None], **kw), "sinks"),
    (lambda q, k, v, **kw: attn.attention_state(q[None], k[None], v[None], **kw), "cu_seqlens_q"),
])
def test_an_option_an_entry_point_does_not_take_is_refused(function, keyword):
    q, k, v = _inputs()
    with pytest.raises(TypeError, match=f"^{keyword}: not an option of attention_state"):
        function(q, k, v, **{keyword: [0.0, 0.0]})


def test_explain_names_the_fast_kernels_plan():
    q, k, v = _inputs()
    said = attn.explain(q, k, v, causal=True)
    assert said["backend"] == "fast" and said["reason"] == ""
    assert "float32 FMA chains" in said["plan"]


def test_explain_says_why_float64_runs_the_reference():
    q, k, v = _inputs(np.float64)
    said = attn.explain(q, k, v)
    assert said == {"backend": "reference",
                    "reason": "the fast CPU kernel does not serve float64 inputs (it computes "
                              "in float32)",
                    "plan": ""}
    assert attn.explain(*_inputs(), backend="reference")["reason"] == \
        "the reference backend was asked for"


def test_explain_checks_arguments_as_attention_does():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="^softcap: expected a finite number >= 0"):
        attn.explain(q, k, v, softcap=-1.0)


_FALLBACK_SCRIPT = """
import warnings
import numpy as np
import attn
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 5, 8)) for _ in range(3))
with warnings.catch_warnings(record=True) as asked:
    warnings.simplefilter("always")
    attn.attention(q, k, v, backend="reference")
    attn.weights(q, k, backend="reference")
try:
    attn.attention(q, k, v, backend="fast")
    raised = ""
except ValueError as error:
    raised = str(error)
with warnings.catch_warnings(record=True) as automatic:
    warnings.simplefilter("always")
    attn.attention(q, k, v)
    attn.attention(q, k, v)
    attn.weights(q, k)
print(len(asked))
print(raised)
for w in automatic:
    print(w.category.__name__, "|", w.message)
"""


def test_the_float64_reference_is_never_a_silent_fallback():
    """Automatic says once that it runs the reference (once per reason per process: a fresh
    interpreter runs it); asked for, it says nothing; fast raises."""
    result = subprocess.run([sys.executable, "-c", _FALLBACK_SCRIPT], capture_output=True,
                            text=True, timeout=120, check=True)
    lines = result.stdout.splitlines()
    assert lines[0] == "0", "the reference was asked for, and a warning came"
    assert lines[1].startswith("backend: expected a request the fast CPU kernel supports")
    assert lines[2:] == [
        "FallbackWarning | attn: running the float64 reference, which is far slower: the fast "
        "CPU kernel does not serve float64 inputs (it computes in float32); ask for backend "
        "reference to run it without this notice (explain says why before a call)"]
    assert result.stderr == ""


def test_backend_names_are_checked():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="^backend: expected 'automatic', 'fast' or 'reference'"):
        attn.attention(q, k, v, backend="gpu")


def test_pv_precision_names_are_checked_and_weights_stay_exact():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="^pv_precision: expected 'exact' or 'bf16'"):
        attn.attention(q, k, v, pv_precision="fp8")
    out, lse, weights = attn.attention(q, k, v, pv_precision="exact", return_lse=True,
                                       return_weights=True)
    _, want_lse, want_weights = attn.attention(q, k, v, return_lse=True, return_weights=True)
    assert np.array_equal(lse, want_lse) and np.array_equal(weights, want_weights)
    assert attn._attn.Options().pv_precision == "bf16"  # the default, as torch's kernels round P
