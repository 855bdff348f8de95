"""What a peer's fp16 and bf16 attention computes in: NMSE against float64 of the inputs as the
dtype holds them, for PyTorch's SDPA and OpenVINO's one-op model built as bench/peers.py times
them (and attn's, where the attn module is installed). peers.py checks each peer in float32
only; a peer may meet a low-precision hint by computing in a lower one, which its speed
shows and this error names.

    .venv/bin/python bench/peer_precision.py [--length 512] [--dim 128] [--causal]
"""
import argparse

import numpy as np

from peers import OpenVinoPeer, TorchPeer, make_inputs, reference_attention


def nmse(got, want):
    return float(((got - want) ** 2).sum() / (want**2).sum())


def as_dtype(x, torch, dtype):
    """x rounded to dtype and back to float32: the inputs every peer then holds exactly."""
    return torch.from_numpy(x).to(getattr(torch, dtype)).float().numpy()


def openvino_output(peer, case, q, k, v, dtype):
    request = peer.request(case, q, k, v, dtype, 1)
    request.infer()
    data = np.asarray(request.get_output_tensor(0).data)
    if dtype == "bfloat16":  # OpenVINO hands bf16 out as its bits, typed float16
        data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return data.astype(np.float64).reshape(q.shape)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    torch_peer, openvino_peer = TorchPeer(), OpenVinoPeer()
    torch = torch_peer.torch
    try:
        import attn
    except ImportError:
        attn = None
    case = {"batch": 1, "heads": 2, "heads_kv": 2, "len_q": args.length, "len_k": args.length,
            "dim": args.dim, "causal": args.causal, "work": "forward", "threads": 1}
    print(f"openvino cpu_capabilities: {openvino_peer.capabilities}")
    print(f"case: {case}; NMSE against float64")
    for dtype in ("float16", "bfloat16"):
        q, k, v = (as_dtype(x, torch, dtype) for x in make_inputs(case))
        want = reference_attention(q, k, v, args.causal)
        row = {"torch": nmse(torch_peer.prepare({**case, "dtype": dtype}, q, k, v)()
                             .double().numpy(), want),
               "openvino": nmse(openvino_output(openvino_peer, case, q, k, v, dtype), want)}
        if attn is not None:
            held = [torch.from_numpy(x).to(getattr(torch, dtype)) for x in (q, k, v)]
            row["attn"] = nmse(torch.as_tensor(attn.attention(*held, causal=args.causal))
                               .double().numpy(), want)
        print(f"{dtype}: " + "  ".join(f"{name} {error:.2e}" for name, error in row.items()))


if __name__ == "__main__":
    main()
