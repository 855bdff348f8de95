"""attn in five minutes. Run after `pip install .` from the repository root:

    python examples/quickstart.py
"""

import numpy as np

import attn

rng = np.random.default_rng(0)

# Attention for 2 heads, 5 queries and 7 keys of dimension 4: [H, L, D] arrays.
q = rng.standard_normal((2, 5, 4)).astype(np.float32)
k = rng.standard_normal((2, 7, 4)).astype(np.float32)
v = rng.standard_normal((2, 7, 4)).astype(np.float32)

# 1. The lesson's three steps: scores, softmax weights (alpha), context C = sum alpha_i v_i.
s = attn.scores(q, k)  # [2, 5, 7], scaled by 1/sqrt(4)
alpha = attn.softmax(s)  # rows are non-negative and sum to 1
c = attn.context(alpha, v)  # [2, 5, 4]
print("weights of query 0, head 0:", np.round(alpha[0, 0], 3), "sum", alpha[0, 0].sum())

# 2. All three fused, exact: one call.
out = attn.attention(q, k, v)
print("attention == context of the three steps:", np.allclose(out, c, atol=1e-6))

# 3. The same by hand in NumPy, for comparison.
scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
weights = np.exp(scores - scores.max(-1, keepdims=True))
weights /= weights.sum(-1, keepdims=True)
print("NumPy by hand matches:", np.allclose(out, weights @ v, atol=1e-6))

# 4. Options: causal (top-left as in PyTorch, or bottom-right as in FlashAttention), a
#    sliding window, a boolean mask (True = may attend), the log-sum-exp and the weights.
out, lse, w = attn.attention(q, k, v, causal=True, causal_align="bottom-right",
                             return_lse=True, return_weights=True)
print("bottom-right causal weights, head 0:\n", np.round(w[0], 2))

# 5. PyTorch's signature, for a drop-in swap: [..., L, E] arrays.
out = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
print("scaled_dot_product_attention output:", out.shape, out.dtype)

# 6. torch tensors in, torch tensors out (when torch is installed).
try:
    import torch
except ImportError:
    print("torch is not installed; NumPy arrays work the same way")
else:
    tq = torch.from_numpy(q)
    t_out = attn.scaled_dot_product_attention(tq, tq, tq)
    want = torch.nn.functional.scaled_dot_product_attention(tq, tq, tq)
    print("torch in, torch out:", type(t_out).__name__, "matches torch:",
          torch.allclose(t_out, want, atol=1e-5))
