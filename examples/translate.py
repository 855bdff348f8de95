#!/usr/bin/env python3
"""The lesson's translation example, learned: a small Transformer encoder-decoder trained with
attn on a toy English -> French-like language, then translating held-out sentences greedily,
printing each output word with the input words its cross-attention weighs most.

    python examples/translate.py                 # about a minute on 2 cores
    python examples/translate.py --pictures out  # also the cross-attention, step by step

The corpus is generated here (no download): a few hundred words, sentences of 3-12 words,
with the rules that make translation more than a word-for-word lookup: adjectives follow
their noun ("the black cat" -> "le chat noir"), articles and adjectives agree with the
noun's gender, "is sleeping" (two words) becomes one verb, and some adverbs become two
words. The generator knows which source word each target word translates and which source
words its form depends on (an article's gender is its noun's), so the learned
cross-attention can be checked against the true alignment.

Every attention runs through attn: the encoder's self-attention, the decoder's causal
self-attention and its cross-attention, forward and backward (attn's deterministic
backward, so a seed repeats a run); decoding keeps the decoder's keys and values in
attn.KVCache and reads them with attn.decode.
"""

import argparse
import dataclasses
import os
import time

import numpy as np
import torch
from torch import nn

import attn

# ---- The toy language -----------------------------------------------------------------

PAD, BOS, EOS = 0, 1, 2
CONSONANTS, VOWELS = "bcdfglmnprstv", "aeiou"


def _words(rng, count, syllables, taken):
    """count new pseudo-words of the given syllable counts, none in `taken`."""
    out = []
    while len(out) < count:
        word = "".join(rng.choice(list(CONSONANTS)) + rng.choice(list(VOWELS))
                       for _ in range(rng.integers(*syllables)))
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


@dataclasses.dataclass
class Language:
    nouns: list      # (english, french, feminine)
    adjectives: list  # (english, french masculine, french feminine)
    verbs: list      # (english 3rd person, english gerund, french)
    adverbs: list    # (english, [french words])
    prepositions: list  # (english, french)

    @staticmethod
    def make(seed=0, nouns=80, adjectives=40, verbs=30, adverbs=12, prepositions=6):
        rng = np.random.default_rng(seed)
        taken = {"le", "la", "un", "une", "the", "a", "is"}
        en = lambda n: _words(rng, n, (2, 4), taken)  # noqa: E731
        fr = lambda n: _words(rng, n, (2, 4), taken)  # noqa: E731
        noun_list = [(e, f, bool(rng.integers(2))) for e, f in zip(en(nouns), fr(nouns))]
        adjective_list = [(e, f, f + "e") for e, f in zip(en(adjectives), fr(adjectives))]
        verb_list = [(e + "s", e + "ing", f) for e, f in zip(en(verbs), fr(verbs))]
        adverb_list = []
        for i, (e, f) in enumerate(zip(en(adverbs), fr(adverbs))):
            adverb_list.append((e + "ly", [f] if i % 2 else ["tres", f]))  # half become two
        preposition_list = list(zip(en(prepositions), fr(prepositions)))
        return Language(noun_list, adjective_list, verb_list, adverb_list, preposition_list)

    def noun_phrase(self, rng, source, target, align, depends):
        noun, noun_fr, feminine = self.nouns[rng.integers(len(self.nouns))]
        definite = bool(rng.integers(2))
        adjectives = [self.adjectives[i] for i in
                      rng.choice(len(self.adjectives), rng.integers(0, 3), replace=False)]
        first = len(source)
        source.append("the" if definite else "a")
        source.extend(a[0] for a in adjectives)
        source.append(noun)
        article = ("la" if feminine else "le") if definite else ("une" if feminine else "un")
        noun_at = first + 1 + len(adjectives)
        target.append(article)  # its gender is the noun's
        align.append((first,))
        depends.append((first, noun_at))
        target.append(noun_fr)
        align.append((noun_at,))
        depends.append((noun_at,))
        for i, adjective in enumerate(adjectives):  # after the noun, agreeing with it
            target.append(adjective[2] if feminine else adjective[1])
            align.append((first + 1 + i,))
            depends.append((first + 1 + i, noun_at))

    def sentence(self, rng):
        """(source words, target words, for each target word the indices of the source words
        it translates (two for the verb "is sleeping" becomes) and of those its form depends
        on)."""
        source, target, align, depends = [], [], [], []
        self.noun_phrase(rng, source, target, align, depends)
        verb = self.verbs[rng.integers(len(self.verbs))]
        if rng.integers(2):  # "is sleeping": two words become one, which translates both
            source += ["is", verb[1]]
            align.append((len(source) - 2, len(source) - 1))
        else:
            source.append(verb[0])
            align.append((len(source) - 1,))
        depends.append(align[-1])
        target.append(verb[2])
        if rng.integers(2):
            adverb = self.adverbs[rng.integers(len(self.adverbs))]
            source.append(adverb[0])
            for word in adverb[1]:  # one word may become two
                target.append(word)
                align.append((len(source) - 1,))
                depends.append((len(source) - 1,))
        if rng.integers(2):
            preposition = self.prepositions[rng.integers(len(self.prepositions))]
            source.append(preposition[0])
            target.append(preposition[1])
            align.append((len(source) - 1,))
            depends.append((len(source) - 1,))
            self.noun_phrase(rng, source, target, align, depends)
        return source, target, align, depends


class Vocabulary:
    def __init__(self, sentences):
        self.words = ["<pad>", "<s>", "</s>"] + sorted({w for s in sentences for w in s})
        self.index = {w: i for i, w in enumerate(self.words)}

    def encode(self, words):
        return [self.index[w] for w in words]


# ---- The model: every attention through attn ------------------------------------------

class Attention(nn.Module):
    """Multi-head attention whose softmax(q k^T) v is attn.scaled_dot_product_attention."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def split(self, x):  # [B, L, dim] -> [B, H, L, dim / H]
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def forward(self, x, memory, mask=None, causal=False):
        q, k, v = self.split(self.q(x)), self.split(self.k(memory)), self.split(self.v(memory))
        out = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return self.o(out.transpose(1, 2).flatten(-2))


class Block(nn.Module):
    def __init__(self, dim, heads, cross_heads=0):
        super().__init__()
        self.attention = Attention(dim, heads)
        self.cross = Attention(dim, cross_heads) if cross_heads else None
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(3 if cross_heads else 2))

    def forward(self, x, memory=None, source_mask=None, self_mask=None, causal=False):
        x = x + self.attention(self.norms[0](x), self.norms[0](x), self_mask, causal)
        if self.cross is not None:
            x = x + self.cross(self.norms[1](x), memory, source_mask)
        return x + self.ffn(self.norms[-1](x))


class Translator(nn.Module):
    """One cross-attention head: its weights are the alignment. With two, one head read each
    noun phrase's article and the other its noun, so neither head nor their mean showed which
    word an output word translates; the encoder's self-attention carries a noun's gender to
    its article and adjectives, so one head suffices."""

    def __init__(self, source_words, target_words, dim=64, heads=2, cross_heads=1, length=16):
        super().__init__()
        self.source_embedding = nn.Embedding(source_words, dim)
        self.target_embedding = nn.Embedding(target_words, dim)
        self.positions = nn.Embedding(length, dim)
        self.encoder = Block(dim, heads)
        self.decoder = Block(dim, heads, cross_heads)
        self.out = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, target_words))

    def embed(self, embedding, ids):
        return embedding(ids) + self.positions(torch.arange(ids.shape[1]))

    def encode(self, source):
        keep = (source != PAD)[:, None, None, :]  # [B, 1, 1, S]: padding keys hidden
        # Each source word sees itself and the words after it: a noun's gender still reaches
        # its article and adjectives, but no word's vector carries the words before it, so
        # the cross-attention must look at the word it translates (README.md, "Translation,
        # learned"; tools/translator.cpp is the same model).
        positions = torch.arange(source.shape[1])
        looking_right = positions[None, :] >= positions[:, None]  # [S, S]
        memory = self.encoder(self.embed(self.source_embedding, source),
                              self_mask=keep & looking_right)
        return memory, keep

    def forward(self, source, target_in):
        memory, keep = self.encode(source)
        x = self.decoder(self.embed(self.target_embedding, target_in), memory, keep, causal=True)
        return self.out(x)


def batches(pairs, vocab_in, vocab_out, size, rng):
    order = rng.permutation(len(pairs))
    for start in range(0, len(order) - size + 1, size):
        chosen = [pairs[i] for i in order[start:start + size]]
        source = [vocab_in.encode(p[0]) for p in chosen]
        target = [[BOS] + vocab_out.encode(p[1]) + [EOS] for p in chosen]
        width_s, width_t = max(map(len, source)), max(map(len, target))
        src = torch.tensor([s + [PAD] * (width_s - len(s)) for s in source])
        tgt = torch.tensor([t + [PAD] * (width_t - len(t)) for t in target])
        yield src, tgt


def train(model, pairs, vocab_in, vocab_out, seconds, steps, seed, log=print):
    """Adam over batches of 64 until `steps` steps or `seconds` have passed."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    start, step = time.perf_counter(), 0
    while step < steps and time.perf_counter() - start < seconds:
        for src, tgt in batches(pairs, vocab_in, vocab_out, 64, rng):
            logits = model(src, tgt[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(),
                                               ignore_index=PAD)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 100 == 0:
                log(f"step {step}: loss {loss.item():.3f} ({time.perf_counter() - start:.1f} s)")
            if step >= steps or time.perf_counter() - start >= seconds:
                break
    return step, time.perf_counter() - start


# ---- Greedy translation with attn's KV cache -------------------------------------------

@torch.no_grad()
def translate(model, source_ids, limit=20):
    """(target ids, cross-attention weights [steps, heads, S]) for one sentence: the decoder's
    self-attention reads its keys and values from an attn.KVCache, one step at a time."""
    source = torch.tensor([source_ids])
    memory, _ = model.encode(source)
    block, dim = model.decoder, model.positions.embedding_dim
    heads = block.attention.heads
    cross = block.cross
    memory_k = cross.split(cross.k(memory))[0]  # [H, S, d]
    memory_v = cross.split(cross.v(memory))[0]
    cache = attn.KVCache(heads, dim // heads, dtype="float32")
    seq = cache.add_sequence()
    word, out, weights = BOS, [], []
    for position in range(limit):
        x = model.target_embedding(torch.tensor([[word]])) + model.positions.weight[position]
        h = block.norms[0](x)
        q, k, v = (block.attention.split(layer(h))[0] for layer in
                   (block.attention.q, block.attention.k, block.attention.v))
        cache.append([seq], k[None], v[None])
        context = attn.decode(q[:, 0][None], cache, [seq])[0]  # [H, d]
        x = x + block.attention.o(context.flatten()[None, None])
        q = cross.split(cross.q(block.norms[1](x)))[0]  # [H, 1, d]
        context, _, w = attn.attention(q, memory_k, memory_v, return_lse=True,
                                       return_weights=True)
        x = x + cross.o(context.transpose(0, 1).flatten(-2)[None])
        x = x + block.ffn(block.norms[2](x))
        word = int(model.out(x)[0, -1].argmax())
        if word == EOS:
            break
        out.append(word)
        weights.append(w[:, 0])
    return out, torch.stack(weights) if weights else torch.zeros(0, cross.heads, len(source_ids))


@dataclasses.dataclass
class Scores:
    words: float       # target words right, in place
    sentences: float   # sentences right whole
    aligned: float     # of the right words: at least half the head-mean cross-attention on
                       # the source words they translate
    on_sources: float  # ... on the source words their form depends on
    one_head: float    # ... at least half of some head's cross-attention on the words they
                       # translate


@torch.no_grad()
def cross_values(model, source_ids):
    """The value vectors the decoder's cross-attention blends: [heads, S, dim / heads]."""
    memory, _ = model.encode(torch.tensor([source_ids]))
    cross = model.decoder.cross
    return cross.split(cross.v(memory))[0]


def evaluate(model, pairs, vocab_in, vocab_out):
    right = total = whole = aligned = on_sources = one_head = 0
    for source, target, align, depends in pairs:
        ids, weights = translate(model, vocab_in.encode(source), limit=len(target) + 2)
        words = [vocab_out.words[i] for i in ids]
        total += len(target)
        whole += words == target
        for i, want in enumerate(target):
            if i < len(words) and words[i] == want:
                right += 1
                mean = weights[i].mean(0)
                aligned += mean[list(align[i])].sum().item() >= 0.5
                on_sources += mean[list(depends[i])].sum().item() >= 0.5
                one_head += weights[i][:, list(align[i])].sum(-1).max().item() >= 0.5
    return Scores(right / total, whole / len(pairs), aligned / max(right, 1),
                  on_sources / max(right, 1), one_head / max(right, 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=55.0, help="training time limit")
    parser.add_argument("--steps", type=int, default=3000, help="training step limit")
    parser.add_argument("--sentences", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pictures", help="a folder: draw the cross-attention alignments")
    args = parser.parse_args()
    torch.set_num_threads(2)
    language = Language.make(args.seed)
    rng = np.random.default_rng(args.seed + 1)
    pairs = [language.sentence(rng) for _ in range(args.sentences + 200)]
    train_pairs, held_out = pairs[:args.sentences], pairs[args.sentences:]
    vocab_in = Vocabulary([p[0] for p in pairs])
    vocab_out = Vocabulary([p[1] for p in pairs])
    print(f"{len(vocab_in.words) - 3} source and {len(vocab_out.words) - 3} target words; "
          f"{len(train_pairs)} training sentences, {len(held_out)} held out")
    torch.manual_seed(args.seed)  # the model's initial weights
    model = Translator(len(vocab_in.words), len(vocab_out.words))
    steps, seconds = train(model, train_pairs, vocab_in, vocab_out, args.seconds, args.steps,
                           args.seed)
    print(f"trained {steps} steps in {seconds:.1f} s")
    scores = evaluate(model, held_out, vocab_in, vocab_out)
    print(f"held out: {100 * scores.words:.1f}% of words right, {100 * scores.sentences:.1f}% "
          f"of sentences; of the right words, {100 * scores.aligned:.1f}% put at least half "
          f"their cross-attention (mean over heads) on the source words they translate, "
          f"{100 * scores.on_sources:.1f}% on the source words their form depends on; "
          f"{100 * scores.one_head:.1f}% have a head with at least half on the words they "
          f"translate")
    for n, (source, target, _, _) in enumerate(held_out[:3]):
        ids, weights = translate(model, vocab_in.encode(source))
        print("\n" + " ".join(source))
        for i, word in zip(ids, weights.mean(1)):
            top = word.argsort(descending=True)[:2]
            shown = ", ".join(f"{source[j]} {word[j]:.2f}" for j in top)
            print(f"  {vocab_out.words[i]:<12} <- {shown}")
        if args.pictures:
            os.makedirs(args.pictures, exist_ok=True)
            name = os.path.join(args.pictures, f"alignment{n}")
            alignment = weights.transpose(0, 1).numpy()  # [H, output words, input words]
            heads_and_mean = np.concatenate([alignment, alignment.mean(0, keepdims=True)])
            tokens_out = [vocab_out.words[i] for i in ids]
            attn.viz.html(heads_and_mean, name + ".html", tokens=tokens_out, key_tokens=source,
                          title="cross-attention: each head, then their mean (last)")
            attn.viz.heatmap(heads_and_mean, name + ".svg", tokens=tokens_out,
                             key_tokens=source, head=len(alignment),
                             title="cross-attention, mean over heads")
            attn.viz.steps(alignment, cross_values(model, vocab_in.encode(source)),
                           name + "-steps.html", tokens=tokens_out, key_tokens=source,
                           title="Translating \"" + " ".join(source) + "\", word by word")
            print(f"  drew {name}.html, {name}.svg and {name}-steps.html")


if __name__ == "__main__":
    main()
