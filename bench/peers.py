#!/usr/bin/env python3
"""attn side by side with its peers, interleaved in one run.

For every forward and backward case of `attn_bench --list` (B=1, H=8, fp32, 1 and 2
threads; bf16 and fp16 prefill; a grouped-query decode step), each round times
  attn   through the C++ attn_bench (one fresh process per case and round),
  torch  torch.nn.functional.scaled_dot_product_attention (when torch imports); for
         backward, torch.autograd.grad through it (PyTorch's own CPU backward),
  numpy  plain NumPy/BLAS: S = Q K^T, softmax, O = P V, in float32 (so fp32 cases only;
         K and V repeated per query head for grouped-query cases); for backward, the
         same formulas' gradients with P materialised,
  onnxruntime  ONNX Runtime's CPU kernel of the standard ONNX `Attention` op (opset 23;
         float32 and float16, forward only: it has no bfloat16 kernel on CPU),
  openvino  OpenVINO's CPU plugin on a one-op `scaled_dot_product_attention` model, compiled
         with the case's precision hint and thread count (forward only; grouped-query
         heads folded into a broadcast dim, as its users write it),
  zentorch  AMD's zentorch, `torch.ops.zentorch.zentorch_sdpa`, in a venv of its own with
         the torch it supports (--zentorch-python; `make bench-peers` makes .venv-zentorch
         on an AMD CPU): forward only; its op has no GQA, so a decode step folds query
         heads into query rows (causal cases repeat K and V per query head),
one after the other, rotating who goes first, so that a noisy machine slows all of them
alike. A peer that does not import is left out; every peer's output is checked against a
float64 oracle before it is timed: in float32 (a peer off by 1e-4 stops the run), and in
fp16 and bf16 on inputs those hold exactly, whose NMSE is printed beside the peer's
versions (`nmse`): it tells a peer that computes a 16-bit case in a lower precision, and one
off by more than 1e-3 is left out of that dtype's cases ("wrong"). The figure per peer is
the median over rounds of the mean time of one call in a round (calls repeat for at least
--min-time seconds). GFLOP/s use attn_bench's count
(4 * Lq * Lk * D per head forward, 10 * Lq * Lk * D backward, only the unmasked part for
causal) for every peer alike, so a peer that computes the masked half too is charged for it.
Backward cases time the backward alone, from the forward's saved results; dout = q, as in
attn_bench. Dropout cases (training, dropout 0.1) run on attn and torch only: the other
peers have no dropout.

Each peer but attn runs in its own worker process so that their thread pools do not
meet. The table ends with attn / the fastest peer of the case and which one that was. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, when set, are removed from the numpy
worker's environment only: they pin current OpenBLAS builds to an old kernel.
"""

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEERS = ("attn", "torch", "numpy", "onnxruntime", "openvino", "zentorch")
OPENBLAS_PINNING = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


# ---------------------------------------------------------------- worker side


def make_inputs(case):
    """q: [B, Hq, Lq, D]  k, v: [B, Hkv, Lk, D], float32 normals, the same for every peer
    (each converts them to the case's dtype)."""
    import numpy as np

    rng = np.random.default_rng(1)
    b, d = case["batch"], case["dim"]
    q = rng.standard_normal((b, case["heads"], case["len_q"], d), dtype=np.float32)
    k = rng.standard_normal((b, case["heads_kv"], case["len_k"], d), dtype=np.float32)
    v = rng.standard_normal((b, case["heads_kv"], case["len_k"], d), dtype=np.float32)
    return q, k, v


def causal_bias(len_q, len_k):
    """[Lq, Lk]: 0 where query i sees key j (j <= i, PyTorch's top-left alignment), else -inf."""
    import numpy as np

    hidden = np.arange(len_k)[None, :] > np.arange(len_q)[:, None]
    return np.where(hidden, np.float32(-np.inf), np.float32(0.0))


def numpy_attention(q, k, v, bias):
    """q: [B, H, Lq, D]  k, v: [B, H, Lk, D]  bias: [Lq, Lk] or None -> [B, H, Lq, D].

    One head at a time, so S is Lq x Lk float32 (256 MiB at L = 8192), never H of them.
    """
    import numpy as np

    out = np.empty_like(q)
    scaled_q = q * np.float32(1.0 / math.sqrt(q.shape[-1]))
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = scaled_q[b, h] @ k[b, h].T
            if bias is not None:
                s += bias
            s -= s.max(axis=1, keepdims=True)  # only for numerical stability
            np.exp(s, out=s)
            row_sums = s.sum(axis=1, keepdims=True)
            np.matmul(s, v[b, h], out=out[b, h])
            out[b, h] /= row_sums
    return out


def numpy_attention_backward(q, k, v, out, dout, bias):
    """q, out, dout: [B, H, Lq, D]  k, v: [B, H, Lk, D]  bias: [Lq, Lk] or None
    -> dq, dk, dv. FlashAttention-2's formulas with P materialised, one head at a time:
    dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q.
    """
    import numpy as np

    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    scale = np.float32(1.0 / math.sqrt(q.shape[-1]))
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = (q[b, h] * scale) @ k[b, h].T
            if bias is not None:
                s += bias
            s -= s.max(axis=1, keepdims=True)  # only for numerical stability
            np.exp(s, out=s)
            s /= s.sum(axis=1, keepdims=True)
            np.matmul(s.T, dout[b, h], out=dv[b, h])
            dp = dout[b, h] @ v[b, h].T
            dp -= np.sum(dout[b, h] * out[b, h], axis=1, keepdims=True)
            dp *= s
            np.matmul(dp, k[b, h], out=dq[b, h])
            dq[b, h] *= scale
            np.matmul(dp.T, q[b, h], out=dk[b, h])
            dk[b, h] *= scale
    return dq, dk, dv


def reference_attention(q, k, v, causal):
    """float64 oracle for the self-check: q: [B, H, Lq, D]  k, v: [B, H, Lk, D]."""
    import numpy as np

    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s + causal_bias(q.shape[-2], k.shape[-2]).astype(np.float64)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def reference_backward(q, k, v, dout, causal):
    """float64 oracle for the self-check: the gradients of reference_attention, with P
    materialised, in the same formulas as numpy_attention_backward but in float64."""
    import numpy as np

    q, k, v, dout = (x.astype(np.float64) for x in (q, k, v, dout))
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale
    if causal:
        s = s + causal_bias(q.shape[-2], k.shape[-2]).astype(np.float64)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out = p @ v
    ds = p * (dout @ v.swapaxes(-1, -2) - np.sum(dout * out, axis=-1, keepdims=True))
    return ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, p.swapaxes(-1, -2) @ dout


class NumpyPeer:
    def __init__(self):
        import numpy as np
        import threadpoolctl

        self.np = np
        self.threadpoolctl = threadpoolctl
        self.biases = {}

    def describe(self):
        blas = [
            {key: pool.get(key) for key in ("internal_api", "version", "architecture",
                                             "threading_layer", "num_threads")}
            for pool in self.threadpoolctl.threadpool_info()
            if pool.get("user_api") == "blas"
        ]
        return {"numpy": self.np.__version__, "blas": blas}

    def prepare(self, case, q, k, v):
        """The call to time, or None for a case NumPy/BLAS has no kernel for (bf16, fp16;
        dropout, which it would compute by other rules)."""
        if case["dtype"] != "float32" or case.get("dropout"):
            return None
        group = case["heads"] // case["heads_kv"]
        if group > 1:  # grouped-query attention: each KV head serves `group` query heads
            k, v = self.np.repeat(k, group, axis=1), self.np.repeat(v, group, axis=1)
        bias = None
        if case["causal"]:
            key = (case["len_q"], case["len_k"])
            if key not in self.biases:
                self.biases = {key: causal_bias(*key)}
            bias = self.biases[key]
        if case["work"] == "backward":
            out = numpy_attention(q, k, v, bias)
            return lambda: numpy_attention_backward(q, k, v, out, q, bias)
        return lambda: numpy_attention(q, k, v, bias)

    def with_threads(self, threads):
        return self.threadpoolctl.threadpool_limits(limits=threads, user_api="blas")

    def check(self, q, k, v, causal):
        bias = causal_bias(q.shape[-2], k.shape[-2]) if causal else None
        return numpy_attention(q, k, v, bias)

    def check_backward(self, q, k, v, dout, causal):
        bias = causal_bias(q.shape[-2], k.shape[-2]) if causal else None
        return numpy_attention_backward(q, k, v, numpy_attention(q, k, v, bias), dout, bias)


class TorchPeer:
    def __init__(self):
        import torch

        self.torch = torch

    def describe(self):
        return {"torch": self.torch.__version__,
                "cpu_capability": self.torch.backends.cpu.get_cpu_capability()}

    def prepare(self, case, q, k, v):
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        causal, dropout = bool(case["causal"]), case.get("dropout", 0.0)
        if case["work"] == "backward":
            return self._backward(q, k, v, q, causal, dropout)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}[case["dtype"]]
        tq, tk, tv = (torch.from_numpy(x).to(dtype) for x in (q, k, v))
        gqa = case["heads"] != case["heads_kv"]

        def run():
            with torch.inference_mode():
                return sdpa(tq, tk, tv, is_causal=causal, enable_gqa=gqa, dropout_p=dropout)

        return run

    def _backward(self, q, k, v, dout, causal, dropout=0.0):
        """A call of PyTorch's backward of SDPA alone: the forward runs once here and keeps
        its graph (retain_graph), so each call is autograd's backward from the saved tensors."""
        torch = self.torch
        leaves = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal,
                                                               dropout_p=dropout)
        grad_out = torch.from_numpy(dout)
        return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

    @contextlib.contextmanager
    def with_threads(self, threads):
        before = self.torch.get_num_threads()
        self.torch.set_num_threads(threads)
        try:
            yield
        finally:
            self.torch.set_num_threads(before)

    def check(self, q, k, v, causal):
        torch = self.torch
        with torch.inference_mode():
            out = torch.nn.functional.scaled_dot_product_attention(
                *(torch.from_numpy(x) for x in (q, k, v)), is_causal=causal)
        return out.numpy()

    def check_backward(self, q, k, v, dout, causal):
        return [g.numpy() for g in self._backward(q, k, v, dout, causal)()]


def _forward_only(_q, _k, _v, _dout, _causal):
    """check_backward of a peer that has no backward: nothing to compare."""
    return []


class OnnxRuntimePeer:
    """ONNX Runtime's CPU kernel of the standard ONNX `Attention` op (opset 23): 4-D
    [B, H, L, D] inputs, grouped-query heads and is_causal as the op has them. One session
    per case and thread count; no bfloat16 kernel on CPU (ORT 1.31), no backward."""

    def __init__(self):
        import numpy as np
        import onnx
        import onnxruntime

        self.np, self.onnx, self.ort = np, onnx, onnxruntime
        self.sessions = {}
        onnxruntime.set_default_logger_severity(3)

    def describe(self):
        return {"onnxruntime": self.ort.__version__, "onnx": self.onnx.__version__}

    def session(self, shapes, dtype, causal, threads):
        key = (tuple(map(tuple, shapes)), dtype, causal, threads)
        if key not in self.sessions:
            helper, kind = self.onnx.helper, {"float32": 1, "float16": 10}[dtype]
            inputs = [helper.make_tensor_value_info(name, kind, list(shape))
                      for name, shape in zip("qkv", shapes)]
            out_shape = list(shapes[0][:3]) + [shapes[2][3]]
            graph = helper.make_graph(
                [helper.make_node("Attention", ["q", "k", "v"], ["o"], is_causal=int(causal))],
                "attention", inputs, [helper.make_tensor_value_info("o", kind, out_shape)])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
            model.ir_version = 10  # ORT 1.31 reads IR versions up to 13 (onnx 1.23 writes 14)
            options = self.ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            self.sessions = {key: self.ort.InferenceSession(
                model.SerializeToString(), options, providers=["CPUExecutionProvider"])}
        return self.sessions[key]

    def prepare(self, case, q, k, v):
        if (case["work"] == "backward" or case["dtype"] not in ("float32", "float16")
                or case.get("dropout")):
            return None
        dtype = self.np.dtype(case["dtype"])
        feeds = {"q": q.astype(dtype), "k": k.astype(dtype), "v": v.astype(dtype)}
        session = self.session([q.shape, k.shape, v.shape], case["dtype"], bool(case["causal"]),
                               case["threads"])
        return lambda: session.run(None, feeds)

    def with_threads(self, threads):
        return contextlib.nullcontext()  # each session has its own thread count

    def check(self, q, k, v, causal):
        return self.session([q.shape, k.shape, v.shape], "float32", causal, 1).run(
            None, {"q": q, "k": k, "v": v})[0]

    check_backward = staticmethod(_forward_only)


class OpenVinoPeer:
    """OpenVINO's CPU plugin on a one-op model, `opset13.scaled_dot_product_attention`,
    compiled with the case's precision as INFERENCE_PRECISION_HINT and its thread count.
    Grouped-query heads as OpenVINO's users fold them: q [B, Hkv, group, L, D] against K and
    V [B, Hkv, 1, L, D], broadcast by the op. No backward."""

    def __init__(self):
        import numpy as np
        import openvino

        self.np, self.ov = np, openvino
        self.core = openvino.Core()
        self.capabilities = self.core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        self.compiled = {}

    def describe(self):
        return {"openvino": self.ov.__version__, "cpu_capabilities": self.capabilities}

    def request(self, case, q, k, v, dtype, threads):
        np, ov = self.np, self.ov
        from openvino import opset13

        group = q.shape[1] // k.shape[1]
        folded = [q.reshape(q.shape[0], k.shape[1], group, *q.shape[2:]),
                  k[:, :, None], v[:, :, None]]
        element = {"float32": ov.Type.f32, "float16": ov.Type.f16, "bfloat16": ov.Type.bf16}[dtype]
        key = (tuple(x.shape for x in folded), dtype, case["causal"], threads)
        if key not in self.compiled:
            params = [opset13.parameter(list(x.shape), element, name=n)
                      for x, n in zip(folded, "qkv")]
            out = opset13.scaled_dot_product_attention(*params, causal=bool(case["causal"]))
            precision = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
            self.compiled = {key: self.core.compile_model(
                ov.Model([out], params), "CPU",
                {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
                 "PERFORMANCE_HINT": "LATENCY"})}
        request = self.compiled[key].create_infer_request()
        # A Tensor made from an array, a shape and a type shares the array's memory without
        # holding it: the bf16 bits are held here for as long as the request is timed (freed,
        # the inputs were garbage, NaN, and the worker crashed with SIGSEGV).
        self.held_inputs = []
        for i, x in enumerate(folded):
            if dtype == "bfloat16":
                import ml_dtypes

                bits = np.ascontiguousarray(x.astype(ml_dtypes.bfloat16)).view(np.uint16)
                self.held_inputs.append(bits)
                request.set_input_tensor(i, ov.Tensor(bits, list(x.shape), ov.Type.bf16))
            else:
                request.set_input_tensor(i, ov.Tensor(np.ascontiguousarray(x.astype(dtype))))
        return request

    def prepare(self, case, q, k, v):
        if case["work"] == "backward" or case.get("dropout"):
            return None
        if case["dtype"] == "bfloat16" and "BF16" not in self.capabilities:
            return None  # OpenVINO 2026.4 crashed on bf16 D128 where the CPU has no BF16
        request = self.request(case, q, k, v, case["dtype"], case["threads"])
        return request.infer

    def with_threads(self, threads):
        return contextlib.nullcontext()  # each compiled model has its own thread count

    def check(self, q, k, v, causal):
        request = self.request({"causal": causal}, q, k, v, "float32", 1)
        request.infer()
        return self.np.asarray(request.get_output_tensor(0).data).reshape(q.shape)

    check_backward = staticmethod(_forward_only)


class ZentorchPeer(TorchPeer):
    """AMD's zentorch SDPA kernel (`torch.ops.zentorch.zentorch_sdpa`), on the torch its
    venv holds. Its op takes [B, H, L, D] with as many K/V heads as query heads: grouped-query
    cases fold each KV head's query heads into its query rows where no causal mask tells
    them apart (a decode step: K and V read once, as its users would call it), else repeat
    K and V per query head first (outside the timing). No dropout, no backward."""

    def __init__(self):
        super().__init__()
        import zentorch

        self.zentorch = zentorch

    def describe(self):
        return {**super().describe(), "zentorch": self.zentorch.__version__}

    def _run(self, q, k, v, causal):
        torch = self.torch
        group = q.shape[1] // k.shape[1]
        if group > 1 and not causal:
            q = q.reshape(q.shape[0], k.shape[1], group * q.shape[2], q.shape[3])
        elif group > 1:
            k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))

        def run():
            with torch.inference_mode():
                return torch.ops.zentorch.zentorch_sdpa(q, k, v, 0.0, causal)[0]

        return run

    def prepare(self, case, q, k, v):
        if case["work"] == "backward" or case.get("dropout"):
            return None
        torch = self.torch
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}[case["dtype"]]
        return self._run(*(torch.from_numpy(x).to(dtype) for x in (q, k, v)),
                         bool(case["causal"]))

    def check(self, q, k, v, causal):
        return self._run(*(self.torch.from_numpy(x) for x in (q, k, v)), causal)().numpy()

    check_backward = staticmethod(_forward_only)


WORKER_PEERS = {"torch": TorchPeer, "numpy": NumpyPeer, "onnxruntime": OnnxRuntimePeer,
                "openvino": OpenVinoPeer, "zentorch": ZentorchPeer}


def self_check(peer):
    """Largest |peer - float64 oracle| over two tiny cases, causal and not, of the forward
    and of each gradient."""
    import numpy as np

    case = {"batch": 1, "heads": 2, "heads_kv": 2, "len_q": 17, "len_k": 17, "dim": 8}
    q, k, v = make_inputs(case)
    dout = np.random.default_rng(2).standard_normal(q.shape, dtype=np.float32)
    errors = []
    for causal in (False, True):
        errors.append(np.abs(peer.check(q, k, v, causal) - reference_attention(q, k, v, causal)).max())
        for got, want in zip(peer.check_backward(q, k, v, dout, causal),
                             reference_backward(q, k, v, dout, causal)):
            errors.append(np.abs(got - want).max())
    return float(max(errors))


# A 16-bit output further than this from float64 (NMSE) is wrong, not imprecise: computing in
# bf16 gives about 1e-5 on low_precision_errors' case.
WRONG_NMSE = 1e-3


def held_as(x, dtype):
    """float32 x rounded to dtype (to nearest, ties to even) and back: the values every peer
    then holds exactly."""
    import numpy as np

    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def output_as_float64(result, dtype):
    """What a prepared call returned, as float64: a torch tensor, ONNX Runtime's list of
    outputs, OpenVINO's results (bf16 as its bits, typed float16) or an array."""
    import numpy as np

    if hasattr(result, "detach"):
        return result.detach().double().numpy()
    if isinstance(result, (list, tuple)):
        result = result[0]
    elif hasattr(result, "values"):
        result = next(iter(result.values()))
    result = np.asarray(result)
    if dtype == "bfloat16" and result.dtype == np.float16:
        result = (result.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return result.astype(np.float64)


def low_precision_errors(peer):
    """NMSE against float64 of the peer's forward at each 16-bit dtype, as it is timed (None:
    no kernel), on inputs the dtype holds exactly: peers may meet a 16-bit case by computing
    in a lower precision than its dtype's, or wrongly."""
    import numpy as np

    case = {"batch": 1, "heads": 2, "heads_kv": 2, "len_q": 128, "len_k": 128, "dim": 64,
            "causal": False, "work": "forward", "threads": 1}
    errors = {}
    for dtype in ("float16", "bfloat16"):
        q, k, v = (held_as(x, dtype) for x in make_inputs(case))
        run = peer.prepare({**case, "dtype": dtype}, q, k, v)
        if run is None:
            errors[dtype] = None
            continue
        with peer.with_threads(1):
            got = output_as_float64(run(), dtype).reshape(q.shape)
        want = reference_attention(q, k, v, False)
        errors[dtype] = float(np.sum((got - want) ** 2) / np.sum(want**2))
    return errors


def time_calls(run, min_time):
    """Mean seconds of one call, over as many calls as fit in min_time (at least one)."""
    calls, start = 0, time.perf_counter()
    while True:
        run()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / calls


def worker(kind):
    """Answers one JSON line per request line on stdin: first a hello, then timings."""
    protocol = sys.stdout
    sys.stdout = sys.stderr  # whatever a library prints must not break the protocol

    def answer(obj):
        protocol.write(json.dumps(obj) + "\n")
        protocol.flush()

    try:
        peer = WORKER_PEERS[kind]()
    except (ImportError, OSError) as error:  # OSError: a shared library torch links is missing
        answer({"available": False, "reason": str(error)})
        return
    answer({"available": True, "info": {**peer.describe(), "nmse": low_precision_errors(peer)},
            "max_abs_error": self_check(peer)})

    shape_key, inputs, warmed = None, None, set()
    for line in sys.stdin:
        request = json.loads(line)
        case = request["case"]
        key = (case["batch"], case["heads"], case["len_q"], case["len_k"], case["dim"])
        if key != shape_key:
            inputs = None  # free the previous shape first
            inputs, shape_key = make_inputs(case), key
        run = peer.prepare(case, *inputs)
        if run is None:
            answer({"seconds": None})
            continue
        with peer.with_threads(case["threads"]):
            if case["name"] not in warmed:
                run()
                warmed.add(case["name"])
            answer({"seconds": time_calls(run, request["min_time"])})


# ---------------------------------------------------------------- driver side


class Worker:
    def __init__(self, kind, env, python=sys.executable):
        self.kind, self.env, self.python = kind, env, python
        self.process = subprocess.Popen(
            [str(python), __file__, "--worker", kind], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.hello = self._read()

    def _read(self):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.kind} worker exited (exit code {self.process.wait()})")
        return json.loads(line)

    def seconds(self, case, min_time):
        self.process.stdin.write(json.dumps({"case": case, "min_time": min_time}) + "\n")
        self.process.stdin.flush()
        return self._read()["seconds"]

    def close(self):
        self.process.stdin.close()
        self.process.wait()

    def restarted(self):
        """A fresh worker of the same peer, after this one's process ended."""
        self.process.wait()
        return Worker(self.kind, self.env, self.python)


def attn_seconds(attn_bench, case, min_time):
    """Seconds of one attn forward (and attn_bench's FMA peak) from a fresh attn_bench run."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "attn.json"
        command = [str(attn_bench), f"--benchmark_filter=^{re.escape(case['name'])}(/|$)",
                   "--benchmark_repetitions=1", f"--benchmark_min_time={min_time}",
                   "--json", str(out)]
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({run.returncode}):\n{run.stderr}")
        (result,) = json.loads(out.read_text())
    return result["seconds"], result["ceiling_gflops"]


def list_cases(attn_bench, quick, pattern):
    command = [str(attn_bench), "--list"] + (["--quick"] if quick else [])
    listing = subprocess.run(command, capture_output=True, text=True)
    if listing.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({listing.returncode}): {listing.stderr}")
    # The peers compute attention and its gradients, not weights: forward and backward cases.
    return [case for case in json.loads(listing.stdout)
            if case["work"] in ("forward", "backward") and re.search(pattern, case["name"])]


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attn-bench", type=Path, default=Path("build/release/bench/attn_bench"),
                        help="the attn_bench binary (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="leave out the L = 8192 cases")
    parser.add_argument("--filter", default="", help="regex on case names, as in attn_bench --list")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--min-time", type=float, default=0.2,
                        help="seconds of calls per peer, case and round (default 0.2)")
    parser.add_argument("--settle", type=float, default=0.2,
                        help="seconds of sleep before each timing, so that the previous peer's "
                             "spinning threads (OpenBLAS, OpenMP) have gone to sleep "
                             "(default 0.2)")
    parser.add_argument("--json", type=Path, help="also write the table as JSON here")
    parser.add_argument("--zentorch-python", type=Path,
                        help="the python of a venv with zentorch and the torch it supports "
                             "(default: none, zentorch left out)")
    parser.add_argument("--worker", choices=PEERS[1:], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds: expected at least 1, given {args.rounds}")
    if not args.min_time > 0:
        parser.error(f"--min-time: expected seconds > 0, given {args.min_time}")
    if not args.settle >= 0:
        parser.error(f"--settle: expected seconds >= 0, given {args.settle}")
    if args.worker is None and not os.access(args.attn_bench, os.X_OK):
        parser.error(f"--attn-bench: {args.attn_bench} is not an executable (run `make build`)")
    try:
        re.compile(args.filter)
    except re.error as error:
        parser.error(f"--filter: not a regex ({error}): {args.filter}")
    if args.zentorch_python is not None and not os.access(args.zentorch_python, os.X_OK):
        parser.error(f"--zentorch-python: {args.zentorch_python} is not an executable")
    if args.json is not None and not os.access(args.json.parent, os.W_OK):
        parser.error(f"--json: cannot write into {args.json.parent}")
    return args


def start_workers(zentorch_python):
    """A worker per peer; zentorch's runs on zentorch_python (its own venv), or is left out
    without one."""
    numpy_env = {name: value for name, value in os.environ.items() if name not in OPENBLAS_PINNING}
    workers = {kind: Worker(kind, numpy_env if kind == "numpy" else os.environ.copy())
               for kind in PEERS[1:] if kind != "zentorch"}
    if zentorch_python is None:
        print("zentorch: no --zentorch-python (make bench-peers makes .venv-zentorch on an AMD "
              "CPU), left out")
    else:
        workers["zentorch"] = Worker("zentorch", os.environ.copy(), zentorch_python)
    if workers["numpy"].hello["available"]:
        workers["numpy"].hello["info"]["openblas_pinning_removed"] = {
            name: os.environ[name] for name in OPENBLAS_PINNING if name in os.environ}
    for kind, w in list(workers.items()):
        if not w.hello["available"]:
            print(f"{kind}: not importable, left out ({w.hello['reason']})")
            w.close()
            del workers[kind]
            continue
        print(f"{kind}: {json.dumps(w.hello['info'])}")
        if not w.hello["max_abs_error"] < 1e-4:
            raise RuntimeError(f"{kind} disagrees with the float64 oracle by "
                               f"{w.hello['max_abs_error']:.3g}: its timings would mean nothing")
        for dtype, error in w.hello["info"]["nmse"].items():
            if error is not None and not error < WRONG_NMSE:
                print(f"{kind}: its {dtype} output is off float64 by NMSE {error:.3g}; "
                      f"left out of the {dtype} cases (\"wrong\")")
    return workers


def wrong(workers, peer, case):
    """Whether the peer's output at the case's dtype failed low_precision_errors."""
    error = workers[peer].hello["info"]["nmse"].get(case["dtype"])
    return error is not None and not error < WRONG_NMSE


def measure(args, cases, workers):
    """seconds[case name][peer] -> list over rounds; per case, the highest FMA peak that
    attn_bench measured over the rounds (each is already the best of its probes); the
    (case name, peer) pairs whose worker crashed, left out of later rounds."""
    seconds = {case["name"]: {peer: [] for peer in PEERS} for case in cases}
    peaks, crashed = {}, set()
    wrong_pairs = {(case["name"], peer) for case in cases for peer in workers
                   if wrong(workers, peer, case)}
    for round_index in range(args.rounds):
        turn = round_index % len(PEERS)
        order = PEERS[turn:] + PEERS[:turn]
        for case in cases:
            for peer in order:
                time.sleep(args.settle)
                if peer == "attn":
                    s, peak = attn_seconds(args.attn_bench, case, args.min_time)
                    peaks[case["name"]] = max(peak, peaks.get(case["name"], 0.0))
                elif peer in workers and (case["name"], peer) not in crashed | wrong_pairs:
                    try:
                        s = workers[peer].seconds(case, args.min_time)
                    except RuntimeError as error:  # a crash costs the peer only this case
                        print(f"{peer}: {error} on {case['name']}; left out of this case")
                        crashed.add((case["name"], peer))
                        try:
                            workers[peer] = workers[peer].restarted()
                        except RuntimeError as restart_error:
                            print(f"{peer}: {restart_error} on restart; left out from here on")
                            del workers[peer]
                        continue
                else:
                    continue
                if s is not None:
                    seconds[case["name"]][peer].append(s)
        print(f"round {round_index + 1}/{args.rounds} done", flush=True)
    return seconds, peaks, crashed, wrong_pairs


def summarize(cases, seconds, peaks, crashed, wrong_pairs):
    rows = []
    for case in cases:
        row = {"name": case["name"], "flops": case["flops"], "threads": case["threads"],
               "attn_peak_gflops": peaks[case["name"]],
               "crashed": sorted(peer for name, peer in crashed if name == case["name"]),
               "wrong": sorted(peer for name, peer in wrong_pairs if name == case["name"])}
        for peer, times in seconds[case["name"]].items():
            if times:
                row[f"{peer}_seconds"] = statistics.median(times)
                row[f"{peer}_gflops"] = case["flops"] / row[f"{peer}_seconds"] * 1e-9
        row["attn_peak_fraction"] = row["attn_gflops"] / row["attn_peak_gflops"]
        timed = [peer for peer in PEERS[1:] if f"{peer}_gflops" in row]
        for peer in timed:
            row[f"attn_over_{peer}"] = row["attn_gflops"] / row[f"{peer}_gflops"]
        if timed:
            row["best_peer"] = max(timed, key=lambda peer: row[f"{peer}_gflops"])
            row["attn_over_best_peer"] = row[f"attn_over_{row['best_peer']}"]
        rows.append(row)
    return rows


def print_table(rows):
    def cell(row, key, form, peer=None):
        text = "crash" if peer in row["crashed"] else "wrong" if peer in row["wrong"] else "-"
        return format(row[key], form) if key in row else format(text, ">" + form.split(".")[0])

    short = {"onnxruntime": "ort", "openvino": "ov", "zentorch": "zen"}
    names = [short.get(peer, peer) for peer in PEERS[1:]]
    header = (f"{'case':<55} {'attn':>8} {'of peak':>7} "
              + " ".join(f"{name:>8}" for name in names)
              + f" {'attn/best':>9} {'best':>6}")
    print("\nGFLOP/s (median over rounds; causal counts the unmasked part only)")
    print(header)
    for row in rows:
        print(f"{row['name']:<55} {cell(row, 'attn_gflops', '8.2f')} "
              f"{format(100 * row['attn_peak_fraction'], '6.1f')}% "
              + " ".join(cell(row, f"{peer}_gflops", "8.2f", peer) for peer in PEERS[1:])
              + f" {cell(row, 'attn_over_best_peer', '9.2f')} "
              f"{short.get(row.get('best_peer', '-'), row.get('best_peer', '-')):>6}")


def main():
    args = parse_arguments()
    if args.worker:
        worker(args.worker)
        return 0
    workers, info = {}, {}
    try:
        cases = list_cases(args.attn_bench, args.quick, args.filter)
        if not cases:
            print(f"peers.py: no case matches --filter {args.filter!r} (see attn_bench --list)",
                  file=sys.stderr)
            return 2
        workers = start_workers(args.zentorch_python)
        info = {kind: w.hello["info"] for kind, w in workers.items()}
        seconds, peaks, crashed, wrong_pairs = measure(args, cases, workers)
    except RuntimeError as error:
        print(f"peers.py: {error}", file=sys.stderr)
        return 1
    finally:
        for w in workers.values():
            w.close()
    rows = summarize(cases, seconds, peaks, crashed, wrong_pairs)
    print_table(rows)
    if args.json:
        partial = args.json.with_name(args.json.name + ".partial")
        partial.write_text(json.dumps({"peers": info, "cases": rows}, indent=2) + "\n")
        partial.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
