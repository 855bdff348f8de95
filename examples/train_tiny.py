"""Train a tiny character-level Transformer with attn's backward pass, beside PyTorch's SDPA.

    python examples/train_tiny.py [--steps 300] [--text examples/data/alice.txt]

The same model (2 layers, 4 heads, causal) is trained twice from the same seed on the same
batches: once with attn.scaled_dot_product_attention, once with
torch.nn.functional.scaled_dot_product_attention. Both loss curves are printed side by side
with their relative difference; they agree to float32 rounding.
"""

import argparse
import pathlib

import torch
import torch.nn.functional as F

import attn

TEXT = pathlib.Path(__file__).parent / "data" / "alice.txt"


class Block(torch.nn.Module):
    def __init__(self, width, heads, sdpa):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        # [B, L, H, E] memory seen as [B, H, L, E], as Hugging Face models do
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        out = self.sdpa(q, k, v, is_causal=True)
        x = x + self.proj(out.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab, sdpa, width=64, heads=4, layers=2, context=64):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads, sdpa) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train(sdpa, data, vocab, steps, batch=16, context=64, seed=0):
    """The loss at every step of training with `sdpa` as the attention function."""
    torch.manual_seed(seed)
    model = TinyTransformer(vocab, sdpa, context=context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        starts = torch.randint(len(data) - context - 1, (batch,), generator=batches)
        x = torch.stack([data[s : s + context] for s in starts])
        y = torch.stack([data[s + 1 : s + context + 1] for s in starts])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def curves(text, steps):
    """(attn's losses, PyTorch's losses) for `steps` steps on `text`."""
    alphabet = sorted(set(text))
    data = torch.tensor([alphabet.index(c) for c in text])
    return (train(attn.scaled_dot_product_attention, data, len(alphabet), steps),
            train(F.scaled_dot_product_attention, data, len(alphabet), steps))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--text", type=pathlib.Path, default=TEXT)
    args = parser.parse_args()
    ours, theirs = curves(args.text.read_text(), args.steps)
    print(f"{'step':>5} {'attn loss':>12} {'torch loss':>12} {'relative difference':>20}")
    worst = 0.0
    for step, (a, t) in enumerate(zip(ours, theirs), 1):
        difference = abs(a - t) / abs(t)
        worst = max(worst, difference)
        if step == 1 or step % 25 == 0 or step == args.steps:
            print(f"{step:>5} {a:>12.6f} {t:>12.6f} {difference:>20.2e}")
    print(f"largest relative difference over {args.steps} steps: {worst:.2e}")


if __name__ == "__main__":
    main()
