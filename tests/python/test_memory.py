"""Zero-copy in, direct writes out, and no leaks or reference-count drift over many calls."""

import gc
import resource
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

import attn


def _address(a):
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_contiguous_inputs_are_read_in_place(layout):
    q = np.random.default_rng(0).standard_normal((2, 5, 3, 8)).astype(np.float32)
    seen = attn.describe_input(q, layout)
    assert seen["data"] == _address(q)
    assert seen["dtype"] == "float32"
    if layout == "bhsd":
        assert seen["shape"] == (2, 5, 3, 8) and seen["strides"] == (120, 24, 8, 1)
    else:  # [B, L, H, D] seen as [B, H, L, D] through strides, not a transpose copy
        assert seen["shape"] == (2, 3, 5, 8) and seen["strides"] == (120, 8, 24, 1)


def test_strided_views_are_read_in_place():
    base = np.zeros((2, 3, 20, 16), np.float16)
    view = base[1:, :, 3::2, :8]
    seen = attn.describe_input(view)
    assert seen["data"] == _address(view)
    assert seen["shape"] == (1, 3, 9, 8) and seen["strides"] == (960, 320, 32, 1)


@pytest.mark.parametrize("rank", [2, 3])
def test_lower_ranks_are_read_in_place(rank):
    q = np.zeros((4, 6, 8)[3 - rank:], np.float64)
    assert attn.describe_input(q)["data"] == _address(q)


def test_bfloat16_is_read_in_place():
    q = np.zeros((2, 3, 4), ml_dtypes.bfloat16)
    seen = attn.describe_input(q)
    assert seen["data"] == _address(q) and seen["dtype"] == "bfloat16"


class DLPackProducer:
    """Any object with the DLPack protocol, not a NumPy array or a torch tensor."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_producers_are_read_in_place():
    q = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    assert attn.describe_input(DLPackProducer(q))["data"] == _address(q)
    out = attn.attention(DLPackProducer(q), DLPackProducer(q), DLPackProducer(q))
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, attn.attention(q, q, q))


@pytest.mark.parametrize("make", [lambda a: a[:, ::-1], lambda a: a[..., ::2],
                                  lambda a: np.asfortranarray(a)], ids=["negative", "strided_last", "fortran"])
def test_unreadable_layouts_are_copied(make):
    view = make(np.random.default_rng(0).standard_normal((3, 6, 8)))
    seen = attn.describe_input(view)
    assert seen["data"] != _address(view)
    assert seen["strides"][3] == 1 and min(seen["strides"]) >= 0


def test_outputs_are_fresh_arrays_written_in_place():
    q = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    out, lse, weights = attn.attention(q, q, q, return_lse=True, return_weights=True)
    for a in (out, lse, weights):
        assert a.flags.owndata and a.flags.c_contiguous and a.flags.writeable
    s = attn.scores(q, q)  # the C++ result handed over without a copy, kept alive by NumPy
    assert s.base is not None and not s.flags.owndata


def _six_calls(q, mask):
    attn.attention(q, q, q, mask=mask, return_lse=True, return_weights=True)
    attn.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    attn.context(attn.softmax(attn.scores(q, q)), q)
    with pytest.raises(ValueError):
        attn.attention(q, q, q[:, :1])


def test_no_reference_count_drift_or_leaks_over_10000_calls():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 16, 16)).astype(np.float32)
    mask = rng.random((16, 16)) < 0.8
    for _ in range(50):
        _six_calls(q, mask)
    gc.collect()
    refs_before = (sys.getrefcount(q), sys.getrefcount(mask))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(10_000 // 6 + 1):
        _six_calls(q, mask)
    gc.collect()
    assert (sys.getrefcount(q), sys.getrefcount(mask)) == refs_before
    # scores, softmax and context each hand over 2 KiB from the C++ side: leaking them would
    # add 10 MiB
    rss_growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert rss_growth_kib < 4 * 1024, f"resident memory grew by {rss_growth_kib} KiB"

    tracemalloc.start()  # slows every allocation: a shorter run is enough for the Python heap
    traced_before = tracemalloc.get_traced_memory()[0]
    for _ in range(300):
        _six_calls(q, mask)
    gc.collect()
    traced_growth = tracemalloc.get_traced_memory()[0] - traced_before
    tracemalloc.stop()
    assert traced_growth < 16 * 1024, f"the Python heap grew by {traced_growth} bytes"


def test_gil_is_released_while_the_kernel_runs(monkeypatch):
    monkeypatch.setenv("ATTN_BACKEND", "reference")  # slow and steady, whatever kernels exist
    q = np.random.default_rng(0).standard_normal((1, 4, 512, 64))
    start = time.perf_counter()
    attn.attention(q, q, q)
    alone = time.perf_counter() - start
    gaps = []
    worker = threading.Thread(target=attn.attention, args=(q, q, q))
    last = time.perf_counter()
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    worker.join()
    # Held GIL: this loop would stall for the whole kernel. Released: only for switches.
    assert alone > 0.05, f"the kernel took {alone:.3f} s: too short to tell"
    assert max(gaps) < alone / 2, f"main thread stalled {max(gaps):.3f} s of {alone:.3f} s"


def test_results_too_large_for_memory_raise_memory_error():
    """Under an address-space limit (as `ulimit -v` or a container sets one), a weights
    matrix larger than what is left raises MemoryError with its size and what to ask for
    instead, before NumPy's lazy allocation gets the process killed while filling it; a
    top_k above Lk is capped, not allocated."""
    code = textwrap.dedent("""
        import resource
        import numpy as np
        import attn
        q = np.zeros((1, 32768, 4), np.float32)  # weights: 32768^2 float32 = 4 GiB
        vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
                  if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
        for call in (lambda: attn.weights(q, q),
                     lambda: attn.attention(q, q, q, return_weights=True)):
            try:
                call()
                print("computed")
            except MemoryError as e:
                print("MemoryError:", e)
        weights, indices = attn.weights(q[:, :3], q, top_k=10**12)
        print(weights.shape, indices.shape)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("MemoryError: weights [1, 1, 32768, 32768] needs 4.0 GiB, more than the ")
    assert "select heads= or rows=, or ask for top_k" in lines[0]
    assert lines[1].startswith("MemoryError: return_weights: the weights [1, 1, 32768, 32768] needs 4.0 GiB")
    assert "attn.weights with heads=, rows= or top_k" in lines[1]
    assert lines[2] == "(1, 3, 32768) (1, 3, 32768)"
