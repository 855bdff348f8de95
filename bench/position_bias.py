#!/usr/bin/env python3
"""A learned position bias costs little beside the attention it shapes: T5's bucketed table
(attn.PositionBias) against no bias, against the same bias as a materialised [H, L, L] float
mask, and against PyTorch doing what transformers' T5 does (the table gathered into an
[H, L, L] bias, then scaled_dot_product_attention with it as attn_mask), forward alone and
forward + backward (gradients to q, k, v and the table), in one run, interleaved.

Each round times every call once, rotating who goes first; figures are medians over rounds
of the mean time of one call. Every output and the table's gradient are checked against
torch's first.
"""

import argparse
import os
import statistics

import numpy as np
import torch

import attn
from peers import time_calls

BUCKETS, MAX_DISTANCE = 32, 128


def t5_columns(length):
    """[L, L] int64: the column of each (query, key), as attn.PositionBias gives it."""
    distance = np.arange(length)[:, None] - np.arange(length)[None, :]
    probe = attn.PositionBias(np.zeros(BUCKETS, np.float32), "t5", max_distance=MAX_DISTANCE)
    return torch.from_numpy(probe.columns_of(distance))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = (1, args.heads, args.length, args.dim)
    q, k, v, dout = (torch.randn(shape) for _ in range(4))
    table = torch.randn(args.heads, BUCKETS)
    columns = t5_columns(args.length)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def leaves():
        return [x.clone().requires_grad_() for x in (q, k, v, table)]

    def attn_bias(grad):
        xs = leaves() if grad else [q, k, v, table]
        out = attn.attention(*xs[:3], scale=1.0, threads=args.threads,
                             position_bias=attn.PositionBias(xs[3], "t5",
                                                             max_distance=MAX_DISTANCE))
        if grad:
            out.backward(dout)
        return out, xs

    def attn_none(grad):
        xs = leaves() if grad else [q, k, v, table]
        out = attn.attention(*xs[:3], scale=1.0, threads=args.threads)
        if grad:
            out.backward(dout)
        return out, xs

    def attn_mask(grad):
        xs = leaves() if grad else [q, k, v, table]
        out = attn.attention(*xs[:3], scale=1.0, threads=args.threads,
                             mask=xs[3][:, columns][None])
        if grad:
            out.backward(dout)
        return out, xs

    def torch_sdpa(grad):
        xs = leaves() if grad else [q, k, v, table]
        out = sdpa(*xs[:3], attn_mask=xs[3][:, columns][None], scale=1.0)
        if grad:
            out.backward(dout)
        return out, xs

    runs = {"attn bias": attn_bias, "attn none": attn_none, "attn float mask": attn_mask,
            "torch sdpa": torch_sdpa}
    want, want_xs = torch_sdpa(True)
    for name in ("attn bias", "attn float mask"):
        got, got_xs = runs[name](True)
        assert (got - want).abs().max() < 1e-4, f"{name}: output differs"
        scale = want_xs[3].grad.abs().max()
        error = (got_xs[3].grad - want_xs[3].grad).abs().max()
        assert error < 1e-4 * scale, f"{name}: table gradient differs by {error}"

    calls = {}
    for name, run in runs.items():
        calls[f"{name} forward"] = lambda run=run: run(False)
        calls[f"{name} training"] = lambda run=run: run(True)
    seconds = {key: [] for key in calls}
    names = list(calls)
    for round_index in range(args.rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for key in order:
            if key.endswith("forward"):
                with torch.no_grad():
                    seconds[key].append(time_calls(calls[key], args.min_time))
            else:
                seconds[key].append(time_calls(calls[key], args.min_time))
    median = {key: statistics.median(values) * 1e3 for key, values in seconds.items()}
    print(f"B=1 H={args.heads} L={args.length} D={args.dim} fp32, T5 buckets {BUCKETS} to "
          f"{MAX_DISTANCE}, {args.threads} threads, {args.rounds} rounds; ms, median of rounds")
    print(f"{'':>17} {'forward':>9} {'/ none':>7} {'training':>9} {'/ none':>7}")
    for name in runs:
        fwd, train = median[f"{name} forward"], median[f"{name} training"]
        print(f"{name:>17} {fwd:>9.1f} {fwd / median['attn none forward']:>7.2f} "
              f"{train:>9.1f} {train / median['attn none training']:>7.2f}")


if __name__ == "__main__":
    main()
