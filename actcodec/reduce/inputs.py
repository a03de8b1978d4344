"""What the reductions accept: numpy arrays (and anything with ``__array_interface__``), CPU
torch tensors (zero-copy), and device arrays (numba's, or anything with
``__cuda_array_interface__``). Host inputs become a flat signed-integer view of the float bits.

bfloat16 follows the codecs' convention: an ``ml_dtypes.bfloat16`` array, a uint16/int16 array
of bit patterns passed with ``dtype="bfloat16"``, or a torch bfloat16 tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

FLOATS = ("float16", "bfloat16", "float32", "float64")
INT_OF = {2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}

try:  # optional, as for the codecs
    import ml_dtypes as _ml_dtypes

    _BF16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None


_NAMES = {np.dtype(n): n for n in ("float16", "float32", "float64")}
if _BF16 is not None:
    _NAMES[_BF16] = "bfloat16"


@dataclass(frozen=True)
class Host:
    bits: np.ndarray  # 1-D contiguous int16/int32/int64 view of the elements
    name: str  # one of FLOATS
    wrap: Callable[[np.ndarray], object]  # result bits -> array of the caller's kind


def is_torch(x) -> bool:
    return type(x).__module__.split(".", 1)[0] == "torch"


def is_device(x) -> bool:
    """A CUDA array: a torch CUDA tensor, a numba device array, or any CUDA-array-interface
    object (CPU torch tensors refuse the interface, so hasattr is False for them)."""
    if is_torch(x):
        return x.device.type == "cuda"
    return bool(getattr(type(x), "__cuda_ndarray__", False)) or hasattr(
        x, "__cuda_array_interface__")


def _unsupported(dt) -> TypeError:
    return TypeError(f"unsupported dtype {dt}; the reductions take float16, bfloat16 "
                     f"(ml_dtypes, torch, or uint16 with dtype='bfloat16'), float32, float64")


def host(x, dtype: str | None, any_order: bool) -> Host:
    """Flat bits of a host array. `any_order`: the element order does not matter (a whole-array
    reduction), so any dense layout is read in place; otherwise C order is needed, and a
    non-C-contiguous input is copied once."""
    if dtype is not None and dtype != "bfloat16":
        raise ValueError(f"dtype tag {dtype!r} is not supported; only 'bfloat16' tags uint16 data")
    if is_torch(x):
        arr, name, wrap = _from_torch(x, dtype)
    else:
        arr = np.asarray(x)
        name = _numpy_name(arr, dtype)
        wrap = _numpy_wrap(name)
    if arr.size == 0:
        raise ValueError("min/max of an empty array is undefined")
    flat = np.ravel(arr, order="K") if any_order else np.ascontiguousarray(arr).reshape(-1)
    return Host(flat.view(INT_OF[flat.itemsize]), name, wrap)


def _numpy_name(arr: np.ndarray, tag: str | None) -> str:
    dt = arr.dtype
    if tag == "bfloat16":
        if dt not in (np.dtype(np.uint16), np.dtype(np.int16), _BF16):
            raise TypeError(f"dtype='bfloat16' needs 16-bit (bit pattern) data, got {dt}")
        return "bfloat16"
    name = _NAMES.get(dt)
    if name is None:
        raise _unsupported(dt)
    return name


def _numpy_wrap(name: str):
    if name == "bfloat16":
        out = _BF16 if _BF16 is not None else np.dtype(np.uint16)
        return lambda bits: bits.view(out)
    return lambda bits: bits.view(name)


def _from_torch(t, tag: str | None):
    import torch

    if t.device.type != "cpu":
        raise TypeError(f"tensor on {t.device}: host reductions take CPU tensors")
    if tag is not None:
        raise ValueError("dtype= tags numpy bit-pattern arrays; a torch tensor has its own dtype")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        # .numpy() has no bfloat16; the same bits as int16 are zero-copy
        return t.view(torch.int16).numpy(), "bfloat16", lambda bits: torch.from_numpy(
            bits).view(torch.bfloat16)
    names = {torch.float16: "float16", torch.float32: "float32", torch.float64: "float64"}
    if t.dtype not in names:
        raise _unsupported(t.dtype)
    name = names[t.dtype]
    return t.numpy(), name, lambda bits: torch.from_numpy(bits.view(name))
