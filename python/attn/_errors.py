"""attn's exceptions. Each is also a RuntimeError, which is what PyTorch raises for the
same mistakes, so code written against torch.nn.functional.scaled_dot_product_attention
catches attn's errors too.

    attn.Error (from the extension): bad input; a ValueError and a RuntimeError.
    attn.ArgumentTypeError: an argument of the wrong type; a TypeError and a RuntimeError.
"""

from ._attn import Error


class ArgumentTypeError(TypeError, RuntimeError):
    """An argument of the wrong type: a TypeError and a RuntimeError."""


__all__ = ["ArgumentTypeError", "Error"]
