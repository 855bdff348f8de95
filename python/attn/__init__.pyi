# Type stubs for attn. Arrays are NumPy arrays, torch tensors (CPU) or other DLPack
# producers; outputs are NumPy arrays, or torch tensors when a torch tensor went in.
from typing import Any, Dict, Literal, Optional, Sequence, Tuple, Union, overload

from typing_extensions import Unpack

# The options every entry point shares (attention, weights, attention_backward,
# attention_state, decode, attn.dist.attention): defined once, with the code that reads them.
from ._request import OptionKeywords as OptionKeywords

Array = Any  # numpy.ndarray | torch.Tensor | a DLPack producer
Numbers = Union[Sequence[float], Array]

from . import viz as viz
# attn.dist (dist.pyi) is not imported with attn: `import attn.dist` (it imports mpi4py).

__version__: str
__all__: list[str]

class Error(ValueError, RuntimeError):
    """Bad input to attn: a ValueError and a RuntimeError."""

class ArgumentTypeError(TypeError, RuntimeError):
    """An argument of the wrong type: a TypeError and a RuntimeError."""

class FallbackWarning(UserWarning):
    """A call ran attn's float64 reference: the fast kernels do not serve it."""

@overload
def attention(
    q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
    layout: Literal["bhsd", "bshd"] = "bhsd", return_lse: Literal[False] = False,
    return_weights: Literal[False] = False,
    **options: Unpack[OptionKeywords],
) -> Array:
    """out [B, Hq, Lq, Dv] (or the input's rank/layout) = softmax(scale q k^T + bias) v."""
@overload
def attention(
    q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
    layout: Literal["bhsd", "bshd"] = "bhsd", return_lse: Literal[True],
    return_weights: Literal[False] = False,
    **options: Unpack[OptionKeywords],
) -> Tuple[Array, Array]:
    """(out, lse [B, Hq, Lq])."""
@overload
def attention(
    q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
    layout: Literal["bhsd", "bshd"] = "bhsd", return_lse: Literal[False] = False,
    return_weights: Literal[True],
    **options: Unpack[OptionKeywords],
) -> Tuple[Array, Array]:
    """(out, weights [B, Hq, Lq, Lk])."""
@overload
def attention(
    q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
    layout: Literal["bhsd", "bshd"] = "bhsd", return_lse: Literal[True],
    return_weights: Literal[True],
    **options: Unpack[OptionKeywords],
) -> Tuple[Array, Array, Array]:
    """(out, lse [B, Hq, Lq], weights [B, Hq, Lq, Lk])."""
@overload
def attention(
    q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
    layout: Literal["bhsd", "bshd"] = "bhsd", return_lse: bool = False,
    return_weights: bool = False,
    **options: Unpack[OptionKeywords],
) -> Union[Array, Tuple[Array, Array], Tuple[Array, Array, Array]]: ...

def attention_backward(
    q: Array, k: Array, v: Array, out: Array, lse: Array, dout: Array, *,
    mask: Optional[Array] = None, layout: Literal["bhsd", "bshd"] = "bhsd",
    **options: Unpack[OptionKeywords],
) -> Tuple[Array, ...]:
    """(dq, dk, dv) in the shapes of q, k, v, then dsinks [Hq] with sinks, then
    dposition_bias (the table's shape) with position_bias."""

def contributions(
    q: Array, k: Array, v: Array, *, output_projection: Optional[Array] = None,
    heads: Optional[Sequence[int]] = None, rows: Optional[Sequence[int]] = None,
    mask: Optional[Array] = None, layout: Literal["bhsd", "bshd"] = "bhsd",
    **options: Unpack[OptionKeywords],
) -> Array:
    """alpha_ij ||v_j|| (or ||v_j W_O^h||) [B, heads, rows, Lk]: what each input adds to C."""

def rollout(weights: Union[Array, Sequence[Array]], residual: float = 0.5) -> Array:
    """float64 [layers, L, L]: attention rollout through the layers (Abnar & Zuidema 2020)."""

def dropout_mask(shape: Sequence[int], dropout_p: float, dropout_seed: int) -> Array:
    """bool [B, Hq, Lq, Lk]: True where dropout with this seed keeps the weight."""

@overload
def weights(
    q: Array, k: Array, *, heads: Optional[Sequence[int]] = None,
    rows: Optional[Sequence[int]] = None, top_k: None = None, mask: Optional[Array] = None,
    layout: Literal["bhsd", "bshd"] = "bhsd",
    **options: Unpack[OptionKeywords],
) -> Array:
    """weights [B, heads, rows, Lk] (without the leading dims q lacks), as attention uses them."""
@overload
def weights(
    q: Array, k: Array, *, heads: Optional[Sequence[int]] = None,
    rows: Optional[Sequence[int]] = None, top_k: int, mask: Optional[Array] = None,
    layout: Literal["bhsd", "bshd"] = "bhsd",
    **options: Unpack[OptionKeywords],
) -> Tuple[Array, Array]:
    """(weights, indices int64), both [B, heads, rows, top_k]: the k largest per row."""

def scaled_dot_product_attention(
    query: Array, key: Array, value: Array, attn_mask: Optional[Array] = None,
    dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[Union[float, Array]] = None,
    enable_gqa: bool = False,
) -> Array:
    """PyTorch's scaled_dot_product_attention: [..., Hq, L, E] x [..., Hkv, S, E] -> [..., Hq, L, Ev]."""

def scores(
    q: Array, k: Array, kind: Literal["dot", "scaled_dot", "general", "additive"] = "scaled_dot",
    scale: Optional[float] = None, weight: Optional[Array] = None,
    query_projection: Optional[Array] = None, key_projection: Optional[Array] = None,
    energy: Optional[Array] = None,
) -> Array:
    """[..., Lq, Dq] x [..., Lk, Dk] -> scores [..., Lq, Lk]."""

def softmax(scores: Array) -> Array:
    """Softmax over the last axis; a row that is -inf everywhere gives zeros."""

def context(weights: Array, v: Array, check: bool = True, tolerance: float = 1e-5) -> Array:
    """weights [..., Lq, Lk] x v [..., Lk, Dv] -> context [..., Lq, Dv]."""

def describe_input(x: Array, layout: Literal["bhsd", "bshd"] = "bhsd") -> Dict[str, Any]:
    """The address, dtype, [B, H, L, D] shape and element strides the kernels read for x."""

class PositionBias:
    """score += table[head, column(query position - key position)]; the position_bias option."""
    table: Array
    shape: Tuple[int, ...]
    buckets: Literal["clipped", "t5", "t5_causal"]
    offset: int
    max_distance: int
    columns: int
    def __init__(
        self, table: Array, buckets: Literal["clipped", "t5", "t5_causal"] = "clipped", *,
        offset: int = 0, max_distance: int = 128,
    ) -> None: ...
    def columns_of(self, distances: Array) -> Array: ...
    def values(self) -> list[float]: ...

BlockKind = Literal["empty", "full", "partial"]

class BlockMask:
    """A boolean pattern [batch, heads, len_q, len_k] stored by blocks; the block_mask option."""
    def __init__(self, ext: Any) -> None: ...
    @classmethod
    def from_predicate(
        cls, predicate: Any, batch: int, heads: int, len_q: int, len_k: int,
        block_size: int = 128,
    ) -> "BlockMask": ...
    @classmethod
    def from_dense(cls, mask: Array, block_size: int = 128) -> "BlockMask": ...
    @classmethod
    def documents(
        cls, query_documents: Array, key_documents: Optional[Array] = None,
        block_size: int = 128,
    ) -> "BlockMask": ...
    @classmethod
    def prefix_lm(
        cls, prefix_lengths: Union[int, Sequence[int], Array], len_q: int, len_k: int,
        block_size: int = 128,
    ) -> "BlockMask": ...
    @classmethod
    def chunked(cls, chunk: int, len_q: int, len_k: int, block_size: int = 128) -> "BlockMask": ...
    @classmethod
    def window_and_global(
        cls, window: int, global_tokens: Union[Sequence[int], Array], len_q: int, len_k: int,
        block_size: int = 128,
    ) -> "BlockMask": ...
    @property
    def shape(self) -> Tuple[int, int, int, int]: ...
    @property
    def block_size(self) -> int: ...
    @property
    def blocks(self) -> Tuple[int, int]: ...
    def block(self, b: int, h: int, qb: int, kb: int) -> BlockKind: ...
    def count(self, kind: BlockKind) -> int: ...
    def visible_fraction(self) -> float: ...
    @property
    def nbytes(self) -> int: ...
    def to_dense(self) -> Array: ...

class State:
    """Attention state per query row: m, l [B, H, Lq] and acc [B, H, Lq, Dv] (NumPy)."""
    m: Any
    l: Any
    acc: Any
    def __init__(self, m: Array, l: Array, acc: Array) -> None: ...
    @classmethod
    def empty(
        cls, batch: int, heads: int, rows: int, dim_v: int,
        dtype: Literal["float32", "float64"] = "float32",
    ) -> "State": ...

def merge(a: State, b: State) -> State:
    """The state over the union of a's and b's (disjoint) keys."""

def finalize(state: State, sinks: Optional[Numbers] = None) -> Tuple[Array, Array]:
    """(out [B, H, Lq, Dv], lse [B, H, Lq]) of a state, sinks counted once."""

def attention_state(
    q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
    **options: Unpack[OptionKeywords],
) -> State:
    """attention of 4-D [B, H, L, D] q, k, v as a State (no sinks, no cu_seqlens)."""

def explain(
    q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
    layout: Literal["bhsd", "bshd"] = "bhsd", **options: Unpack[OptionKeywords],
) -> Dict[str, str]:
    """{backend: "fast" | "reference", reason, plan}: what attention(q, k, v, ...) runs, and why."""

class KVCache:
    """Paged key/value storage (block tables, free list, fork with copy-on-write)."""
    def __init__(
        self, heads_kv: int, dim: int, dim_v: Optional[int] = None, *, page_size: int = 16,
        dtype: Optional[
            Literal["float32", "float16", "bfloat16", "int8", "int4", "fp8_e4m3", "fp8_e5m2"]
        ] = None,
        dtype_v: Optional[
            Literal["float32", "float16", "bfloat16", "int8", "int4", "fp8_e4m3", "fp8_e5m2"]
        ] = None,
        group: int = 0,
        zero_point: bool = False,
        max_blocks: int = 0,
        k_scale: Union[None, float, Sequence[float], Array] = None,
        v_scale: Union[None, float, Sequence[float], Array] = None,
    ) -> None: ...
    def add_sequence(self) -> int: ...
    def fork(self, parent: int) -> int: ...
    def append(self, seq: Union[int, Sequence[int]], k: Array, v: Array) -> None:
        """k [heads_kv, n, dim] to one sequence, or [S, heads_kv, n, dim] to S sequences."""
    def drop(self, seq: int) -> None: ...
    def length(self, seq: int) -> int: ...
    def __contains__(self, seq: object) -> bool: ...
    @property
    def sequence_ids(self) -> list[int]: ...
    def block_table(self, seq: int) -> list[int]: ...
    def pools(self) -> Tuple[Array, Array, Optional[Array], Optional[Array]]: ...
    def block_tables(self, seq_ids: Sequence[int]) -> Tuple[Array, Array]: ...
    def ref_count(self, block: int) -> int: ...
    def keys(self, seq: int) -> Any: ...
    def values(self, seq: int) -> Any: ...
    blocks_allocated: int
    blocks_free: int
    blocks_in_use: int
    heads_kv: int
    dim: int
    dim_v: int
    page_size: int
    dtype: Optional[str]  # None until the first append when it follows the data
    dtype_v: Optional[str]  # the values' storage dtype (dtype unless given apart)
    max_blocks: int
    group: int  # int8, int4: elements per scale along the head dim; 0: one scale per row
    zero_point: bool  # int8, int4: an offset beside each scale (asymmetric codes)
    k_scale: Optional[list[float]]  # fp8: a scale per KV head of the keys; None for 1
    v_scale: Optional[list[float]]

def decode(
    q: Array, cache: KVCache, seq_ids: Sequence[int], *, return_lse: bool = False,
    **options: Unpack[OptionKeywords],
) -> Union[Array, Tuple[Array, Array]]:
    """q [S, Hq, D] or [S, Hq, n_q, D] against the cache -> out [S, Hq, (n_q,) Dv] float32."""

def decode_state(
    q: Array, cache: KVCache, seq_ids: Sequence[int], **options: Unpack[OptionKeywords],
) -> State:
    """decode as a float32 State over [S, Hq, n_q] rows (no sinks)."""

# A pool's format as kv_cache_dtype names it ("fp8": vLLM's name for fp8_e4m3); a (keys,
# values) pair names two.
PoolFormat = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "int4"]

def paged_attention(
    q: Array, key_cache: Array, value_cache: Array, block_table: Array, seq_lens: Array,
    query_start: Array, *, layout: Literal["token_major", "head_major"] = "token_major",
    kv_cache_dtype: Union[PoolFormat, Tuple[PoolFormat, PoolFormat]] = "auto",
    key_scales: Optional[Union[Array, float]] = None,
    value_scales: Optional[Union[Array, float]] = None,
    return_lse: bool = False, rotary: Optional[Literal["neox", "interleaved"]] = None,
    rotary_cos: Optional[Array] = None, rotary_sin: Optional[Array] = None,
    rotary_dims: Optional[int] = None, positions: Optional[Array] = None,
    **options: Unpack[OptionKeywords],
) -> Union[Array, Tuple[Array, Array]]:
    """q [total_q, Hq, D] over the caller's pages -> out [total_q, Hq, Dv] float32."""

def append_pages(
    k: Array, v: Array, slots: Array, key_cache: Array, value_cache: Array, *,
    layout: Literal["token_major", "head_major"] = "token_major",
    kv_cache_dtype: Union[PoolFormat, Tuple[PoolFormat, PoolFormat]] = "auto",
    key_scales: Optional[Union[Array, float]] = None,
    value_scales: Optional[Union[Array, float]] = None,
    rotary: Optional[Literal["neox", "interleaved"]] = None, rotary_cos: Optional[Array] = None,
    rotary_sin: Optional[Array] = None, rotary_dims: Optional[int] = None,
    positions: Optional[Array] = None,
) -> None:
    """k [n, Hkv, D], v [n, Hkv, Dv] written into the pages at slots [n], in place."""
