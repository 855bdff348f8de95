#!/usr/bin/env python3
"""Structured masks cost what they show: attention at L = 8192 under block-sparse masks of
5%, 25% and 50% visible blocks, beside the dense (unmasked) time, in one run, interleaved.

Each round times, rotating who goes first:
  dense       attn.attention without a mask (the time a mask should be a fraction of),
  block       attn.attention with an attn.BlockMask of the pattern,
  attn bool   attn.attention with the same pattern as a dense [L, L] boolean mask,
  sdpa bool   torch.nn.functional.scaled_dot_product_attention with that boolean mask,
  flex        FlexAttention (torch.compile of flex_attention with create_block_mask's
              BlockMask of the same mask_mod) where it compiles and runs on this CPU.
The patterns: blocks of 128 x 128 chosen at random (seeded) until the visible share is
reached, each query block keeping its diagonal block so that no row is empty. Figures are
medians over rounds of the mean time of one call; "block / dense" is held against
1.3 x the share of blocks visible ("bound"). Every output is checked against attn's dense-mask output first.

--memory runs one block-mask forward at the 5% pattern in a fresh process and reports its
peak resident memory above the inputs', beside the [L, L] arrays a dense mask would need.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys

import numpy as np

import attn
from peers import time_calls

BLOCK = 128


def pattern(length, share, seed):
    """A bool [L/128, L/128] block layout with `share` of its blocks visible."""
    blocks = length // BLOCK
    rng = np.random.default_rng(seed)
    layout = np.eye(blocks, dtype=bool)
    wanted = int(round(share * blocks * blocks))
    order = rng.permutation(blocks * blocks)
    for index in order:
        if layout.sum() >= wanted:
            break
        layout.flat[index] = True
    return layout


def mask_mod_of(layout):
    """The pattern as a predicate of index arrays (NumPy or torch): FlexAttention's
    mask_mod and attn.BlockMask.from_predicate's function alike."""

    def mask_mod(b, h, q_idx, kv_idx):
        table = layout_t if hasattr(q_idx, "device") else layout
        return table[q_idx // BLOCK, kv_idx // BLOCK]

    layout_t = None
    try:
        import torch
        layout_t = torch.from_numpy(layout)
    except ImportError:
        pass
    return mask_mod


def measure_memory(args):
    """Peak RSS above the inputs' of one block-mask forward at the 5% pattern (child)."""
    rng = np.random.default_rng(0)
    shape = (1, args.heads, args.length, args.dim)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    out = attn.attention(q[:, :, :256], k[:, :, :256], v[:, :, :256])  # load the kernels
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mask = attn.BlockMask.from_predicate(mask_mod_of(pattern(args.length, 0.05, 1)), 1, 1,
                                         args.length, args.length, block_size=BLOCK)
    out = attn.attention(q, k, v, block_mask=mask)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    del out
    print(f"{(after - before) * 1024} {mask.nbytes}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.25, 0.5])
    parser.add_argument("--no-flex", action="store_true", help="leave FlexAttention out")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        return measure_memory(args)
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None

    length = args.length
    rng = np.random.default_rng(0)
    shape = (1, args.heads, length, args.dim)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v)) if torch else (None,) * 3
    flex, flex_reason = None, ""
    if torch is not None and not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            flex = torch.compile(flex_attention)
        except Exception as error:  # noqa: BLE001 - any failure means "does not run here"
            flex_reason = f"{type(error).__name__}: {error}"

    calls = {"dense": lambda: attn.attention(q, k, v, threads=args.threads)}
    visible_shares = {}
    for share in args.shares:
        layout = pattern(length, share, 1)
        mod = mask_mod_of(layout)
        block_mask = attn.BlockMask.from_predicate(mod, 1, 1, length, length, block_size=BLOCK)
        dense_mask = block_mask.to_dense()[0, 0]
        want = attn.attention(q, k, v, mask=dense_mask, threads=args.threads)
        got = attn.attention(q, k, v, block_mask=block_mask, threads=args.threads)
        assert np.array_equal(got, want), "block mask and dense mask differ"
        name = f"{share:.0%}"
        visible_shares[name] = block_mask.visible_fraction()
        calls[f"block {name}"] = (
            lambda m=block_mask: attn.attention(q, k, v, block_mask=m, threads=args.threads))
        calls[f"attn bool {name}"] = (
            lambda m=dense_mask: attn.attention(q, k, v, mask=m, threads=args.threads))
        if torch is not None:
            torch_mask = torch.from_numpy(dense_mask)
            sdpa = torch.nn.functional.scaled_dot_product_attention
            error = (sdpa(tq, tk, tv, attn_mask=torch_mask).numpy() - want).__abs__().max()
            assert error < 1e-4, f"sdpa differs by {error}"
            calls[f"sdpa bool {name}"] = lambda m=torch_mask: sdpa(tq, tk, tv, attn_mask=m)
        if flex is not None:
            try:
                flex_blocks = create_block_mask(mod, None, None, length, length, device="cpu",
                                                BLOCK_SIZE=BLOCK)
                with torch.no_grad():
                    error = np.abs(flex(tq, tk, tv, block_mask=flex_blocks).numpy() - want).max()
                assert error < 1e-4, f"flex differs by {error}"
                calls[f"flex {name}"] = lambda m=flex_blocks: flex(tq, tk, tv, block_mask=m)
            except Exception as failure:  # noqa: BLE001
                flex, flex_reason = None, f"{type(failure).__name__}: {failure}"
                for key in [key for key in calls if key.startswith("flex")]:
                    del calls[key]
        print(f"{name}: {block_mask.visible_fraction():.3f} of blocks visible "
              f"({block_mask.count('full')} full, {block_mask.count('partial')} partial), "
              f"mask {block_mask.nbytes} bytes against {length * length} for a bool [L, L]",
              flush=True)
    if flex_reason:
        print(f"FlexAttention left out: {flex_reason[:300]}")

    seconds = {key: [] for key in calls}
    names = list(calls)
    no_grad = torch.no_grad() if torch is not None else None
    for round_index in range(args.rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for key in order:
            if no_grad is not None:
                with torch.no_grad():
                    seconds[key].append(time_calls(calls[key], args.min_time))
            else:
                seconds[key].append(time_calls(calls[key], args.min_time))
    median = {key: statistics.median(values) * 1e3 for key, values in seconds.items()}
    print(f"\nB=1 H={args.heads} L={length} D={args.dim} fp32, {args.threads} threads, "
          f"{args.rounds} rounds; ms, median of rounds")
    print(f"dense (no mask): {median['dense']:.1f} ms")
    print(f"{'visible':>8} {'block':>9} {'block/dense':>12} {'bound':>7} {'attn bool':>10} "
          f"{'sdpa bool':>10} {'flex':>9}")
    for share in args.shares:
        name = f"{share:.0%}"
        ratio = median[f"block {name}"] / median["dense"]
        visible = visible_shares[name]

        def cell(key):
            return f"{median[key]:.1f}" if key in median else "-"

        print(f"{visible:>8.3f} {cell('block ' + name):>9} {ratio:>12.3f} {1.3 * visible:>7.3f} "
              f"{cell('attn bool ' + name):>10} {cell('sdpa bool ' + name):>10} "
              f"{cell('flex ' + name):>9}")
    if args.memory:
        child = subprocess.run(
            [sys.executable, __file__, "--memory-child", "--length", str(length), "--heads",
             str(args.heads), "--dim", str(args.dim)], capture_output=True, text=True,
            check=True)
        grown, mask_bytes = (int(x) for x in child.stdout.split())
        print(f"\nmemory: one block-mask forward at 5% grew the peak RSS by {grown / 2**20:.1f} "
              f"MiB (mask {mask_bytes / 2**10:.0f} KiB); a bool [L, L] mask is "
              f"{length * length / 2**20:.0f} MiB, float32 scores {4 * length * length / 2**20:.0f}"
              f" MiB")


if __name__ == "__main__":
    main()
