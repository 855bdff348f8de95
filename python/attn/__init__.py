from ._attn import version as __version__
