#!/usr/bin/env python3
"""What returning the weights costs from Python: attn.attention(q, k, v) against
attn.attention(q, k, v, return_weights=True), allocation of the [B, H, L, L] result
included, interleaved call by call (forward, then with weights) so that a noisy machine
slows both alike. Prints per thread count the median of each and the median of the
per-pair ratios (the issue's target: within 2x). B = 1, H = 8, D = 64, fp32, non-causal,
NumPy inputs and torch tensors (when torch imports).

    .venv/bin/python bench/python_weights.py [--length 2048] [--pairs 9]
"""

import argparse
import statistics
import time

import numpy as np

import attn


def timed(call):
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def measure(q, k, v, threads, pairs):
    forward = lambda: attn.attention(q, k, v, threads=threads)
    with_weights = lambda: attn.attention(q, k, v, threads=threads, return_weights=True)
    forward(), with_weights()  # warm-up: thread pools, first-touch of the library
    times_forward, times_weights, ratios = [], [], []
    for _ in range(pairs):
        t_forward, _ = timed(forward)
        t_weights, result = timed(with_weights)
        del result  # freed before the next pair, as a caller that drops it would
        times_forward.append(t_forward)
        times_weights.append(t_weights)
        ratios.append(t_weights / t_forward)
    return statistics.median(times_forward), statistics.median(times_weights), ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=2048, help="L (default 2048)")
    parser.add_argument("--pairs", type=int, default=9, help="interleaved pairs (default 9)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shape = (1, 8, args.length, 64)
    arrays = {"numpy": tuple(rng.standard_normal(shape, dtype=np.float32) for _ in range(3))}
    try:
        import torch

        arrays["torch"] = tuple(torch.from_numpy(x) for x in arrays["numpy"])
    except ImportError:
        print("torch: not installed, NumPy inputs only")
    print(f"B = 1, H = 8, L = {args.length}, D = 64, fp32; {args.pairs} interleaved pairs")
    print(f"{'inputs':8} {'threads':>7} {'forward ms':>11} {'weights ms':>11} {'ratio':>6}  per pair")
    for kind, (q, k, v) in arrays.items():
        for threads in (1, 2):
            forward, weights, ratios = measure(q, k, v, threads, args.pairs)
            print(f"{kind:8} {threads:7d} {forward * 1e3:11.1f} {weights * 1e3:11.1f} "
                  f"{statistics.median(ratios):6.2f}  {' '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
