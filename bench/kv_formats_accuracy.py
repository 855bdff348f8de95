#!/usr/bin/env python3
"""The context error each KV cache format costs, beside llama.cpp's q8_0, q4_0 and q4_1.

One decode step (GQA Hq 32 on Hkv 8, D 128, --length cached tokens, one query per head)
over keys and values stored in each format: attn's through attn.KVCache and attn.decode,
llama.cpp's by their published block definitions (blocks of 32 along D, a float16 scale
each: q8_0 x = d * q with d = max|x| / 127 and q = round(x / d); q4_0 x = d * (q - 8) with
d = m / -8 for m the block's element of largest magnitude and q = min(15, trunc(x / d + 8.5));
q4_1 x = d * q + m with d = (max - min) / 15, m = min and q = min(15, trunc((x - m) / d + 0.5)),
both float16) applied to the same data and attended in float64. NMSE of the context against float64
attention over the unrounded data, on normal keys and values and on heavy-tailed keys (a
few outlier channels, as real keys have).
"""

import argparse

import numpy as np

import attn

HQ, HKV, D, BLOCK = 32, 8, 128, 32
# (name, KVCache keywords, bits per element: the codes and each float32 scale's share)
ATTN_FORMATS = [("float16", {"dtype": "float16"}, 16), ("bfloat16", {"dtype": "bfloat16"}, 16),
                ("int8", {"dtype": "int8"}, 8 + 32 / D),
                ("int8 group 64", {"dtype": "int8", "group": 64}, 8 + 32 / 64),
                ("int8 group 32", {"dtype": "int8", "group": 32}, 8 + 32 / 32),
                ("int4", {"dtype": "int4"}, 4 + 32 / D),
                ("int4 group 32", {"dtype": "int4", "group": 32}, 4 + 32 / 32),
                ("int8 zero point", {"dtype": "int8", "zero_point": True}, 8 + 64 / D),
                ("int4 zero point group 32", {"dtype": "int4", "group": 32, "zero_point": True},
                 4 + 64 / 32),
                ("fp8_e4m3", {"dtype": "fp8_e4m3"}, 8), ("fp8_e5m2", {"dtype": "fp8_e5m2"}, 8),
                # Keys and values in two formats (dtype_v: llama.cpp's type_k and type_v).
                ("int8 group 32 keys, int4 group 32 values",
                 {"dtype": "int8", "dtype_v": "int4", "group": 32}, (9 + 5) / 2),
                ("float16 keys, int4 group 32 values",
                 {"dtype": "float16", "dtype_v": "int4", "group": 32}, (16 + 5) / 2)]


def q8_0(x):
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    d = (np.abs(blocks).max(-1, keepdims=True) / 127).astype(np.float16).astype(np.float64)
    inverse = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    return (np.round(blocks * inverse) * d).reshape(x.shape)


def q4_0(x):
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    at = np.abs(blocks).argmax(-1)[..., None]
    d = (np.take_along_axis(blocks, at, -1) / -8).astype(np.float16).astype(np.float64)
    inverse = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, np.trunc(blocks * inverse + 8.5))
    return ((q - 8) * d).reshape(x.shape)


def q4_1(x):
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    low, high = blocks.min(-1, keepdims=True), blocks.max(-1, keepdims=True)
    d = ((high - low) / 15).astype(np.float16).astype(np.float64)
    m = low.astype(np.float16).astype(np.float64)
    inverse = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, np.trunc((blocks - low) * inverse + 0.5))
    return (q * d + m).reshape(x.shape)


# llama.cpp's formats by name: (the keys' rounding, the values').
LLAMA_FORMATS = {"llama.cpp q8_0": (q8_0, q8_0), "llama.cpp q4_0": (q4_0, q4_0),
                 "llama.cpp q4_1": (q4_1, q4_1), "llama.cpp q8_0 keys, q4_0 values": (q8_0, q4_0)}


def attention(q, k, v):
    """q [Hq, D], k and v [Hkv, L, D] -> context [Hq, D] in float64."""
    group = HQ // HKV
    k, v = np.repeat(k, group, 0), np.repeat(v, group, 0)
    s = np.einsum("hd,hld->hl", q, k) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hl,hld->hd", p / p.sum(-1, keepdims=True), v)


def nmse(got, want):
    return float(np.sum((got - want) ** 2) / np.sum(want ** 2))


def data(kind, length, rng):
    q = rng.standard_normal((HQ, D))
    k = rng.standard_normal((HKV, length, D))
    v = rng.standard_normal((HKV, length, D))
    if kind == "heavy-tailed":
        channels = rng.choice(D, 4, replace=False)
        k[:, :, channels] *= 20.0
        q[:, channels] /= 20.0  # the outliers' share of the scores stays that of a channel
    return q, k, v


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    kinds = ("normal", "heavy-tailed")
    rows = {}
    for kind in kinds:
        q, k, v = data(kind, args.length, np.random.default_rng(args.seed))
        want = attention(q, k, v)
        for name, keywords, _ in ATTN_FORMATS:
            cache = attn.KVCache(HKV, D, **keywords)
            seq = cache.add_sequence()
            cache.append(seq, k.astype(np.float32), v.astype(np.float32))
            got = attn.decode(q[None, :, None].astype(np.float32), cache, [seq])[0, :, 0]
            rows.setdefault(name, {})[kind] = nmse(got.astype(np.float64), want)
        for name, (keys, values) in LLAMA_FORMATS.items():
            rows.setdefault(name, {})[kind] = nmse(attention(q, keys(k), values(v)), want)
    bits = {name: n for name, _, n in ATTN_FORMATS}
    bits.update({"llama.cpp q8_0": 8.5, "llama.cpp q4_0": 4.5, "llama.cpp q4_1": 5,
                 "llama.cpp q8_0 keys, q4_0 values": (8.5 + 4.5) / 2})
    print(f"Hq {HQ}, Hkv {HKV}, D {D}, Lk {args.length}: context NMSE against float64")
    print("| format | bits per element | " + " | ".join(kinds) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in kinds) + " |")
    for name, errors in rows.items():
        print(f"| {name} | {bits[name]:g} | " + " | ".join(f"{errors[k]:.2e}" for k in kinds)
              + " |")


if __name__ == "__main__":
    main()
