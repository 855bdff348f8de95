#!/usr/bin/env python3
"""Generated tokens per second of transformers' continuous batching with attn serving its
paged attention (attn.integrations.continuous_batching, "attn_paged") against the same
manager on transformers' "sdpa" (which gathers each sequence's cache per layer and step) and
against plain model.generate() with sdpa on the padded batch, interleaved in one process.

The model: a random Llama-style decoder (--layers, hidden 1024, 16 query heads over 4 KV
heads, D 64, float32 or bfloat16); --requests prompts of lengths spread over
[--min-prompt, --max-prompt], --new greedy tokens each. Each round runs the three ways
once, in an order that rotates; a figure is the median over --rounds. The greedy tokens of
the continuous-batching ways are compared (float32: identical), so that all did the work.
"""

import argparse
import os
import statistics
import time

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM

import attn.integrations.continuous_batching as cb


def make_model(layers, dtype):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=1024, intermediate_size=2048,
                         num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
                         max_position_embeddings=8192)
    return LlamaForCausalLM(config).to(dtype).eval()


def make_prompts(requests, shortest, longest):
    generator = torch.Generator().manual_seed(1)
    lengths = torch.linspace(shortest, longest, requests).round().long().tolist()
    return [torch.randint(1, 2048, (n,), generator=generator).tolist() for n in lengths]


def continuous(model, implementation, prompts, new_tokens):
    model.set_attn_implementation(implementation)
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                              pad_token_id=0)
    batching = ContinuousBatchingConfig(page_size=64, max_blocks_per_request=0)
    start = time.perf_counter()
    outputs = model.generate_batch(prompts, generation_config=config,
                                   continuous_batching_config=batching)
    seconds = time.perf_counter() - start
    model.destroy_cached_continuous_batching_manager()
    tokens = [outputs[f"req_{i}"].generated_tokens for i in range(len(prompts))]
    return seconds, tokens


def plain(model, prompts, new_tokens):
    model.set_attn_implementation("sdpa")
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as generate() wants for decoders
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return time.perf_counter() - start, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--min-prompt", type=int, default=256)
    parser.add_argument("--max-prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    cb.register()
    model = make_model(args.layers, getattr(torch, args.dtype))
    prompts = make_prompts(args.requests, args.min_prompt, args.max_prompt)
    generated = args.requests * args.new
    ways = {
        "attn_paged": lambda: continuous(model, cb.NAME, prompts, args.new),
        "cb sdpa": lambda: continuous(model, "sdpa", prompts, args.new),
        "generate sdpa": lambda: plain(model, prompts, args.new),
    }
    print(f"{args.requests} requests, prompts {args.min_prompt}-{args.max_prompt} tokens, "
          f"{args.new} new each, {args.layers} layers, Hq 16 / Hkv 4, D 64, {args.dtype}; "
          f"generated tokens/s, median of {args.rounds} rounds")
    print(f"{'threads':>7} {'attn_paged':>11} {'cb sdpa':>9} {'generate sdpa':>14} "
          f"{'attn/cb sdpa':>13} {'attn/generate':>14}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        os.environ["ATTN_NUM_THREADS"] = str(threads)  # attn reads it at every call
        names = list(ways)
        for name in names:  # warm-up
            ways[name]()
        seconds = {name: [] for name in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            tokens = {}
            for name in order:
                elapsed, tokens[name] = ways[name]()
                seconds[name].append(elapsed)
            if args.dtype == "float32" and tokens["attn_paged"] != tokens["cb sdpa"]:
                raise SystemExit("attn_paged and cb sdpa generated different tokens")
        rate = {name: generated / statistics.median(s) for name, s in seconds.items()}
        print(f"{threads:>7} {rate['attn_paged']:>11.1f} {rate['cb sdpa']:>9.1f} "
              f"{rate['generate sdpa']:>14.1f} {rate['attn_paged'] / rate['cb sdpa']:>13.2f} "
              f"{rate['attn_paged'] / rate['generate sdpa']:>14.2f}")


if __name__ == "__main__":
    main()
