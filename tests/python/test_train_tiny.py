"""examples/train_tiny.py, short: training with attn's backward pass follows PyTorch's SDPA
step for step from the same seed."""

import importlib.util
import pathlib

import pytest

pytest.importorskip("torch")

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "train_tiny.py"


def test_loss_curves_agree_with_torch():
    spec = importlib.util.spec_from_file_location("train_tiny", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    ours, theirs = example.curves(example.TEXT.read_text(), steps=30)
    assert theirs[-1] < 0.8 * theirs[0]  # it learns
    for step, (a, t) in enumerate(zip(ours, theirs), 1):
        assert abs(a - t) <= 1e-4 * abs(t), f"step {step}: attn {a}, torch {t}"
