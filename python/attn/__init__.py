"""attn: exact, fast attention on CPUs.

    import attn
    out = attn.attention(q, k, v, causal=True)                    # FlashAttention-style
    out = attn.scaled_dot_product_attention(query, key, value)    # PyTorch's signature
    s = attn.scores(q, k); w = attn.softmax(s); c = attn.context(w, v)   # the three steps
    attn.viz.heatmap(w, "weights.svg", tokens=words); attn.viz.html(w, "weights.html")
    attn.viz.blend(w, v, "query3.svg", row=3, tokens=words)      # C as a blend of the values
    w = attn.weights(q, k, causal=True)                           # attention's weights
    w, keys = attn.weights(q, k, top_k=8)                         # the 8 largest per row
    c = attn.contributions(q, k, v)        # alpha_ij ||v_j||: what each input adds to C
    r = attn.rollout(output.attentions)    # attention rollout through a model's layers
    attn.explain(q, k, v)                      # which kernel runs, and why (before running)
    out = attn.attention(q, k, v, dropout_p=0.1)  # training; attn.dropout_mask shows it
    dq, dk, dv = attn.attention_backward(q, k, v, out, lse, dout)  # gradients (and autograd)
    cache = attn.KVCache(heads_kv, dim); out = attn.decode(q_step, cache, ids)   # generation
    attn.append_pages(k, v, slots, k_cache, v_cache)            # an engine's own pages (vLLM)
    out = attn.paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start)
    import attn.dist; out = attn.dist.attention(q_r, k_r, v_r, comm=MPI.COMM_WORLD)  # over MPI

NumPy arrays, torch tensors (CPU) and other DLPack producers go in, in float16, bfloat16,
float32 or float64; NumPy arrays come out, or torch tensors when torch tensors went in.
Bad input raises attn.Error (a ValueError) or attn.ArgumentTypeError (a TypeError); both
are RuntimeErrors too, as PyTorch raises for the same mistakes. attn.dist (ring attention
over an mpi4py communicator) is imported on its own: `import attn` loads no MPI.
"""

from ._attention import attention, describe_input, explain, scaled_dot_product_attention
from ._backward import attention_backward
from ._block_mask import BlockMask
from ._attn import version as __version__
from ._contributions import contributions
from ._dropout import dropout_mask
from ._errors import ArgumentTypeError, Error, FallbackWarning
from ._generation import KVCache, State, attention_state, decode, decode_state, finalize, merge
from ._lesson import context, scores, softmax
from ._paged import append_pages, paged_attention
from ._position_bias import PositionBias
from ._rollout import rollout
from ._weights import weights
from . import _torch_ops, viz

if _torch_ops.torch_imported():
    _torch_ops.register()  # torch.compile and torch.export find attn::sdpa from the start

__all__ = [
    "ArgumentTypeError",
    "BlockMask",
    "Error",
    "FallbackWarning",
    "KVCache",
    "PositionBias",
    "State",
    "__version__",
    "append_pages",
    "attention",
    "attention_backward",
    "attention_state",
    "context",
    "contributions",
    "decode",
    "decode_state",
    "describe_input",
    "dropout_mask",
    "explain",
    "finalize",
    "merge",
    "paged_attention",
    "rollout",
    "scaled_dot_product_attention",
    "scores",
    "softmax",
    "weights",
]
