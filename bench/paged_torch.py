#!/usr/bin/env python3
"""A serving step's mixed batch through attn.paged_attention against the torch code an
engine would otherwise write, interleaved in one process.

The batch: one prefill chunk (the newest --chunk tokens of a --context-token sequence)
beside --decodes one-token decode steps over --context tokens each; GQA Hq 32 on Hkv 8,
D 128, bf16 or fp16, token-major pools [pages, 16, Hkv, D] with one table row per sequence.
  attn   one attn.paged_attention call over the pools, in place (causal)
  torch  per sequence: gather its pages from the pools (index_select), then
         torch.nn.functional.scaled_dot_product_attention with enable_gqa, a bottom-right
         causal mask for the chunk, none for a one-token step; outputs concatenated
Each round times both, the one that goes first alternating; a figure is the median over
rounds. Both outputs are compared (NMSE, float64) so that the two did the same work.
"""

import argparse
import statistics
import time

import numpy as np
import torch

import attn

PAGE, HQ, HKV, D = 16, 32, 8, 128


def make_batch(dtype, chunk, decodes, context, seed=1):
    rng = np.random.default_rng(seed)
    sequences = decodes + 1
    pages_each = -(-context // PAGE)
    pages = sequences * pages_each
    k_cache = torch.from_numpy(rng.standard_normal((pages, PAGE, HKV, D), np.float32)).to(dtype)
    v_cache = torch.from_numpy(rng.standard_normal((pages, PAGE, HKV, D), np.float32)).to(dtype)
    table = torch.arange(pages, dtype=torch.int32).reshape(sequences, pages_each)
    seq_lens = torch.full((sequences,), context, dtype=torch.int32)
    queries = [chunk] + [1] * decodes
    query_start = torch.tensor(np.concatenate([[0], np.cumsum(queries)]), dtype=torch.int32)
    q = torch.from_numpy(rng.standard_normal((sum(queries), HQ, D), np.float32)).to(dtype)
    return q, k_cache, v_cache, table, seq_lens, query_start


def torch_step(q, k_cache, v_cache, table, seq_lens, query_start, masks):
    outs = []
    for s in range(table.shape[0]):
        n = int(seq_lens[s])
        pages = table[s, : -(-n // PAGE)].long()
        k = k_cache.index_select(0, pages).reshape(-1, HKV, D)[:n].transpose(0, 1)
        v = v_cache.index_select(0, pages).reshape(-1, HKV, D)[:n].transpose(0, 1)
        qs = q[int(query_start[s]) : int(query_start[s + 1])].transpose(0, 1)
        mask = masks.get((qs.shape[1], n))
        o = torch.nn.functional.scaled_dot_product_attention(
            qs[None], k[None], v[None], attn_mask=mask, enable_gqa=True)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


def timed(fn, min_time):
    calls, start = 0, time.perf_counter()
    while True:
        result = fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / calls, result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--decodes", type=int, default=31)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.5)
    args = parser.parse_args()
    print(f"mixed batch: a {args.chunk}-token chunk + {args.decodes} one-token steps over "
          f"{args.context} keys each, Hq {HQ} / Hkv {HKV}, D {D}, page {PAGE}; torch "
          f"{torch.__version__} ({torch.backends.cpu.get_cpu_capability()}); medians of "
          f"{args.rounds} interleaved rounds")
    print(f"{'dtype':9} {'threads':>7} {'attn ms':>10} {'torch ms':>10} {'torch/attn':>10} {'NMSE':>9}")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for dtype in (torch.bfloat16, torch.float16):
            q, k_cache, v_cache, table, seq_lens, query_start = make_batch(
                dtype, args.chunk, args.decodes, args.context)
            # The chunk's queries are the sequence's newest tokens: bottom-right causal.
            visible = torch.ones(args.chunk, args.context, dtype=torch.bool).tril(args.context - args.chunk)
            masks = {(args.chunk, args.context): visible}
            ways = {
                "attn": lambda: attn.paged_attention(q, k_cache, v_cache, table, seq_lens, query_start,
                                                     causal=True, threads=threads),
                "torch": lambda: torch_step(q, k_cache, v_cache, table, seq_lens, query_start, masks),
            }
            outputs = {name: way() for name, way in ways.items()}  # warm-up
            seconds = {name: [] for name in ways}
            for r in range(args.rounds):
                for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                    seconds[name].append(timed(ways[name], args.min_time)[0])
            want = outputs["torch"].double()
            nmse = float(((outputs["attn"].double() - want) ** 2).sum() / (want ** 2).sum())
            a, t = (statistics.median(seconds[n]) for n in ("attn", "torch"))
            print(f"{str(dtype).removeprefix('torch.'):9} {threads:7d} {a * 1e3:10.1f} {t * 1e3:10.1f} "
                  f"{t / a:10.2f} {nmse:9.1e}", flush=True)


if __name__ == "__main__":
    main()
