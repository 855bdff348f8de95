"""examples/translate.py, smaller: a fixed number of training steps from a fixed seed (attn's
backward is deterministic), then greedy translation of held-out sentences with attn's KV
cache: most words right, and the cross-attention of the right words on the source word they
translate (the corpus generator's alignment)."""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import translate  # noqa: E402


def test_a_small_translator_learns_the_words_and_their_alignment():
    torch.set_num_threads(2)
    language = translate.Language.make(seed=3)
    rng = np.random.default_rng(4)
    pairs = [language.sentence(rng) for _ in range(3100)]
    train, held_out = pairs[:3000], pairs[3000:]
    vocab_in = translate.Vocabulary([p[0] for p in pairs])
    vocab_out = translate.Vocabulary([p[1] for p in pairs])
    torch.manual_seed(3)  # the initial weights, whatever the tests before drew
    model = translate.Translator(len(vocab_in.words), len(vocab_out.words))
    steps, _ = translate.train(model, train, vocab_in, vocab_out, seconds=float("inf"),
                               steps=300, seed=3, log=lambda _: None)
    assert steps == 300
    scores = translate.evaluate(model, held_out, vocab_in, vocab_out)
    assert scores.words >= 0.9, scores
    assert scores.aligned >= 0.9 and scores.on_sources >= 0.9, scores
    # Every output word was generated through the KV cache: its cross-attention rows sum to 1.
    ids, weights = translate.translate(model, vocab_in.encode(held_out[0][0]))
    assert len(ids) == weights.shape[0] > 0
    np.testing.assert_allclose(weights.sum(-1).numpy(), 1.0, atol=1e-5)


def test_the_generator_keeps_its_rules():
    language = translate.Language.make(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        source, target, align, depends = language.sentence(rng)
        assert 3 <= len(source) <= 12 and len(target) == len(align) == len(depends)
        for words, sources in zip(align, depends):
            assert set(words) <= set(sources) and all(0 <= s < len(source) for s in sources)
    assert len({w for n in language.nouns for w in n[:2]}) == 2 * len(language.nouns)
