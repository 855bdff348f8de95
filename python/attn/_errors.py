"""attn's exceptions. Each is also a RuntimeError, which is what PyTorch raises for the
same mistakes, so code written against torch.nn.functional.scaled_dot_product_attention
catches attn's errors too.

    attn.Error (from the extension): bad input; a ValueError and a RuntimeError.
    attn.ArgumentTypeError: an argument of the wrong type; a TypeError and a RuntimeError.
    attn.FallbackWarning (from the extension, a UserWarning): a call ran attn's float64
        reference, far slower, because the fast kernels do not serve it (float64 inputs);
        warned once per reason. attn.explain says why before a call; options
        backend="reference" asks for it without the warning.
"""

from ._attn import Error, FallbackWarning


class ArgumentTypeError(TypeError, RuntimeError):
    """An argument of the wrong type: a TypeError and a RuntimeError."""


__all__ = ["ArgumentTypeError", "Error", "FallbackWarning"]
