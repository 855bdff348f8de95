"""Arrays in and out: turns what a caller passes (NumPy arrays, torch tensors, other
DLPack producers, nested lists) into arrays the extension reads in place, and allocates
outputs of the caller's own kind (NumPy, or torch when a torch tensor came in).

An array reaches the extension as a 4-D [B, H, S, D] view of the caller's memory when its
last dim is contiguous; negative strides, a strided last dim or misaligned data are copied
first (a C-order copy / Tensor.contiguous), never read wrongly.
"""

import functools
import math
import sys

import numpy as np

from ._errors import ArgumentTypeError, Error
from ._attn import check_memory as _check_memory

_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")
_PLAIN_FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _torch():
    """torch if the caller has imported it, else None (attn never imports torch itself)."""
    return sys.modules.get("torch")


def is_torch(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


@functools.lru_cache(maxsize=64)
def _numpy_dtype_name(dtype):
    return dtype.name  # computed in Python by NumPy, slow enough to matter per call


def dtype_name(x):
    """'float32', 'bfloat16', 'bool', ... for a NumPy array or a torch tensor."""
    if isinstance(x, np.ndarray):
        return _numpy_dtype_name(x.dtype)
    return str(x.dtype).removeprefix("torch.")


def _check_dtype(x, name, allow_bool):
    given = dtype_name(x)
    allowed = _FLOAT_NAMES + (("bool",) if allow_bool else ())
    if given not in allowed:
        expected = ", ".join(allowed[:-1]) + " or " + allowed[-1]
        raise ArgumentTypeError(f"{name}: expected dtype {expected}, given {given}")


def records_gradients(*arrays):
    """True when autograd records and one of arrays is a torch tensor that requires grad."""
    torch = _torch()
    return (torch is not None and torch.is_grad_enabled()
            and any(is_torch(x) and x.requires_grad for x in arrays))


def refuse_gradients(x, name):
    """For an argument attn computes no gradient for (a mask, slopes, a cache's contents):
    a result silently detached from it would train nothing, so a tensor that needs
    gradients is refused while autograd records (NotImplementedError naming it)."""
    if records_gradients(x):
        raise NotImplementedError(
            f"{name}: requires_grad=True while gradients are recorded, but attn computes no "
            f"gradient for {name} here; call it under torch.no_grad() or "
            f"torch.inference_mode(), or pass {name}.detach()"
        )


def as_array(x, name, allow_bool=False, detach=False):
    """x as a NumPy array or a CPU torch tensor of a supported dtype, without a copy when
    it already is one. Raises TypeError naming `name` otherwise, and refuses a tensor that
    needs gradients (refuse_gradients) unless detach: only reading its values (a picture)."""
    if type(x) is np.ndarray and x.dtype in _PLAIN_FLOATS:
        return x  # the common case, checked first because every call pays for it
    if x is None:
        raise ArgumentTypeError(f"{name}: expected an array, given None")
    if is_torch(x):
        if type(x) not in (_torch().Tensor, _torch().nn.Parameter):
            raise ArgumentTypeError(
                f"{name}: expected a plain torch.Tensor, given the subclass {type(x).__name__}, "
                f"whose meaning attn cannot know (pass x.as_subclass(torch.Tensor) to read its data)"
            )
        if x.device.type != "cpu":
            raise Error(f"{name}: expected a tensor on the CPU, given one on {x.device}")
        if x.layout != _torch().strided:
            raise Error(f"{name}: expected a dense (strided) tensor, given {x.layout}")
        _check_dtype(x, name, allow_bool)
        if not detach:
            refuse_gradients(x, name)
        return x.detach()
    if isinstance(x, np.ma.MaskedArray):
        raise ArgumentTypeError(f"{name}: expected a plain array, given a masked array (pass mask= instead)")
    if isinstance(x, np.ndarray):
        array = x if type(x) is np.ndarray else np.asarray(x)  # np.matrix reshapes oddly
    elif hasattr(x, "__dlpack__"):
        try:
            array = np.from_dlpack(x)
        except (BufferError, TypeError, ValueError, RuntimeError) as error:
            raise ArgumentTypeError(
                f"{name}: expected a CPU array NumPy can read through DLPack, "
                f"given {type(x).__name__} ({error})"
            ) from None
    else:
        try:
            array = np.asarray(x)
        except (TypeError, ValueError) as error:
            raise ArgumentTypeError(f"{name}: expected an array, given {type(x).__name__} ({error})") from None
    _check_dtype(array, name, allow_bool)
    return array


def shape(x):
    return tuple(x.shape)  # a tuple of ints for NumPy; torch.Size is a tuple of ints too


def reshape(x, new_shape):
    """A view with new_shape where the strides allow, else a copy (both frameworks)."""
    return x.reshape(new_shape)


def permute(x, axes):
    return x.permute(*axes) if is_torch(x) else x.transpose(axes)


def broadcast(x, new_shape):
    if is_torch(x):
        return x.expand(*new_shape)
    return np.broadcast_to(x, new_shape)


def readable(x):
    """x itself when the extension can read it in place: last dim contiguous, no negative
    strides, aligned data; else a contiguous copy."""
    if not isinstance(x, np.ndarray):  # a torch tensor: never negative strides
        if x.ndim and x.shape[-1] > 1 and x.stride(-1) != 1:
            return x.contiguous()
        return x
    if x.flags.c_contiguous and x.flags.aligned:
        return x
    itemsize = x.dtype.itemsize
    last_ok = x.ndim == 0 or x.shape[-1] <= 1 or x.strides[-1] == itemsize
    strides_ok = all(s >= 0 and s % itemsize == 0 for s in x.strides)
    if last_ok and strides_ok and x.flags.aligned:
        return x
    return x.copy(order="C")  # np.ascontiguousarray would keep misaligned data as it is


def for_extension(x):
    """What the extension receives for x: x itself, or for a NumPy bfloat16 array
    (ml_dtypes) a uint16 view of the same memory, which the extension reads as bfloat16."""
    if isinstance(x, np.ndarray) and dtype_name(x) == "bfloat16":
        return x.view(np.uint16)
    return x


# Outputs from this size on are NumPy memory even for torch callers (see empty()): the
# dtypes both have, by element size.
_NUMPY_BACKED = {"float16": 2, "float32": 4, "float64": 8}
_LARGE = 4 << 20


def empty(like, new_shape, dtype_of):
    """An uninitialised array of `like`'s kind (NumPy or torch). dtype_of: a dtype name,
    'float32' or 'float64' or the name of like's dtype."""
    torch = _torch()
    if is_torch(like):
        if dtype_of in _NUMPY_BACKED and math.prod(new_shape) * _NUMPY_BACKED[dtype_of] >= _LARGE:
            # NumPy asks Linux for transparent huge pages on large arrays and torch.empty does
            # not: first-touching 128 MiB of 4 KiB pages took 28-44 ms against numpy's 15-17.
            return torch.from_numpy(np.empty(new_shape, dtype=np.dtype(dtype_of)))
        return torch.empty(new_shape, dtype=getattr(torch, dtype_of))
    if dtype_of == dtype_name(like):
        return np.empty(new_shape, dtype=like.dtype)
    return np.empty(new_shape, dtype=np.dtype(dtype_of))


def empty_in_layout(like, new_shape, dtype_of):
    """empty() whose dims but the last lie in memory in the order of like's (same rank):
    largest stride outermost, broadcast (stride 0) and size-1 dims first. A query read from
    [B, L, H, E] memory gives an output in [B, L, H, Ev] memory, as PyTorch does."""
    strides = like.stride() if is_torch(like) else like.strides
    dims = like.ndim - 1

    def outermost_first(i):
        moves = like.shape[i] > 1 and strides[i] != 0
        return (-strides[i] if moves else -math.inf, i)

    order = sorted(range(dims), key=outermost_first) + [dims]
    out = empty(like, tuple(new_shape[i] for i in order), dtype_of)
    return permute(out, tuple(order.index(i) for i in range(dims + 1)))


def zeros(like, new_shape, dtype_of):
    out = empty(like, new_shape, dtype_of)
    out[...] = 0
    return out


def check_memory(what, shape, itemsize, instead):
    """MemoryError saying what to do instead when an array of shape and itemsize would not
    fit in the memory available: NumPy allocates lazily, so a matrix too large would get
    the process killed while being filled instead of raising."""
    nbytes = itemsize
    for extent in shape:
        nbytes *= extent
    _check_memory(what, min(nbytes, 2**64 - 1), instead)


def stats_dtype(x):
    """The dtype of lse and weights: float64 for float64 inputs, else float32."""
    return "float64" if dtype_name(x) == "float64" else "float32"


def from_extension(result, like):
    """A NumPy array the extension returned, as the kind and dtype of `like`: uint16 bits
    become bfloat16, and a torch input gives a torch tensor on the same memory."""
    is_bfloat16 = dtype_name(like) == "bfloat16"
    if is_torch(like):
        tensor = _torch().from_numpy(result)
        return tensor.view(_torch().bfloat16) if is_bfloat16 else tensor
    return result.view(like.dtype) if is_bfloat16 else result


def like_kind(array, like):
    """A NumPy array the extension returned (float32 or float64), as a torch tensor on the
    same memory when like is a torch tensor."""
    return _torch().from_numpy(array) if is_torch(like) else array


def _small_array(values, name):
    """A short argument (per-head numbers, offsets) as a NumPy array."""
    if is_torch(values):
        refuse_gradients(values, name)
        values = values.detach().cpu()
        # NumPy has no bfloat16: widen floats, which are converted to float64 anyway
        values = (values.double() if values.is_floating_point() else values).numpy()
    try:
        return np.asarray(values)
    except (TypeError, ValueError) as error:
        raise ArgumentTypeError(f"{name}: expected a 1-D sequence of numbers ({error})") from None


def per_head(values, name):
    """A 1-D sequence of numbers (list, NumPy array, tensor) as a list of floats."""
    if values is None:
        return []
    array = _small_array(values, name)
    if array.dtype == object or array.dtype.kind not in "iuf":
        raise ArgumentTypeError(f"{name}: expected a sequence of numbers, given dtype {array.dtype}")
    if array.ndim != 1:
        raise Error(f"{name}: expected a 1-D sequence (one value per query head), given shape {array.shape}")
    return [float(x) for x in array]


def offsets(values, name):
    """cu_seqlens: a 1-D sequence of integers as a list of ints."""
    array = _small_array(values, name)
    if array.dtype == object or array.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{name}: expected a sequence of integers, given dtype {array.dtype}")
    if array.ndim != 1:
        raise Error(f"{name}: expected a 1-D sequence of offsets, given shape {array.shape}")
    return [int(x) for x in array]


def number(value, name, *, allow_none=False, finite=True):
    """A real number argument (or a 0-d array of one) as a float, with a TypeError naming
    it otherwise; finite=False leaves the value's check to attn's core (an option's)."""
    if value is None and allow_none:
        return None
    if (is_torch(value) or isinstance(value, np.ndarray)) and value.ndim == 0:
        refuse_gradients(value, name)
        value = value.item()  # a 0-d tensor or array, e.g. a scale computed with torch
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"{name}: expected a number, given {type(value).__name__}")
    result = float(value)
    if finite and not math.isfinite(result):
        raise Error(f"{name}: expected a finite number, given {result}")
    return result


INDEX_MIN, INDEX_MAX = -(2**63), 2**63 - 1  # what the extension's 64-bit ints hold
INT_MAX = 2**31 - 1


def integer(value, name, expected, low=INDEX_MIN, high=INDEX_MAX):
    """An int argument (Python or NumPy integer) from low to high (by default the range of
    the extension's 64-bit ints), with a TypeError naming it when it is not an int and a
    ValueError when it is out of range (instead of nanobind's list of signatures)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{name}: expected {expected}, given {value!r}")
    value = int(value)
    if not low <= value <= high:
        raise Error(f"{name}: expected {expected} from {low} to {high}, given {value}")
    return value


def flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name}: expected True or False, given {type(value).__name__}")
    return bool(value)
