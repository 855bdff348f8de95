"""attn.dropout_mask: the weights that dropout keeps for a seed, as the kernels keep them."""

from . import _arrays
from ._attn import dropout_mask as _dropout_mask
from ._errors import ArgumentTypeError


def dropout_mask(shape, dropout_p, dropout_seed):
    """Which weights attn.attention(..., dropout_p=dropout_p, dropout_seed=dropout_seed) and
    its backward keep: a NumPy bool array of shape (B, Hq, Lq, Lk), True where weight
    (b, h, i, j) is kept (and scaled by 1 / (1 - dropout_p)), False where it is dropped.
    Each is kept with probability 1 - dropout_p (in steps of 2^-24), as a function of the
    seed and (b, h, i, j) alone: rows and columns of q and k in bhsd order, the packed
    arrays' for packed sequences. For FlashAttention's return_attn_probs, or to check."""
    if not isinstance(shape, (tuple, list)) or len(shape) != 4:
        raise ArgumentTypeError(f"shape: expected 4 ints (B, Hq, Lq, Lk), given {shape!r}")
    dims = [_arrays.integer(d, "shape", "an int") for d in shape]
    p = _arrays.number(dropout_p, "dropout_p", finite=False)
    seed = _arrays.integer(dropout_seed, "dropout_seed", "an int", low=0, high=2**64 - 1)
    return _dropout_mask(dims, p, seed)
