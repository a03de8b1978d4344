"""Element types the codecs accept, and their wire ids.

The float types go through every codec; bool only through raw and mask. bfloat16 has no
numpy dtype of its own: it is accepted as an ``ml_dtypes.bfloat16`` array, or as a uint16
array of bit patterns tagged with ``dtype="bfloat16"``. Decoding gives an
``ml_dtypes.bfloat16`` array when ml_dtypes is installed, else the uint16 bit patterns.
"""
from __future__ import annotations

import math

import numpy as np

try:  # optional: the bfloat16 numpy dtype (ships with jax/tensorflow; pip install ml_dtypes)
    import ml_dtypes as _ml_dtypes

    _BF16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

# name -> (wire id, element size, numpy dtype used to hold the bits)
DTYPES = {
    "float16": (1, 2, np.dtype(np.float16)),
    "bfloat16": (2, 2, np.dtype(np.uint16)),
    "float32": (3, 4, np.dtype(np.float32)),
    "float64": (4, 8, np.dtype(np.float64)),
    "bool": (5, 1, np.dtype(np.bool_)),
}
FLOATS = ("float16", "bfloat16", "float32", "float64")
DTYPE_BY_ID = {wire: name for name, (wire, _, _) in DTYPES.items()}
# numpy dtype -> name, for the lookups every encode and decode makes (dtype.name is slow)
_NAME_OF = {np.dtype(t): t.__name__ for t in (np.float16, np.float32, np.float64)}
_NAME_OF[np.dtype(np.bool_)] = "bool"
if _BF16 is not None:
    _NAME_OF[_BF16] = "bfloat16"


def dtype_name(arr: np.ndarray, tag: str | None = None) -> str:
    """The codec dtype name of `arr` (with an optional bfloat16 tag over uint16 data)."""
    dt = arr.dtype
    if tag is None and dt in _NAME_OF:
        return _NAME_OF[dt]
    if tag is not None:
        if tag != "bfloat16":
            raise ValueError(f"dtype tag {tag!r} is not supported; only 'bfloat16' tags uint16 data")
        if dt not in (np.dtype(np.uint16), _BF16):
            raise TypeError(f"dtype='bfloat16' needs uint16 (bit pattern) data, got {dt}")
        return "bfloat16"
    if _BF16 is not None and dt == _BF16:
        return "bfloat16"
    if dt.name in DTYPES and dt.name != "bfloat16":
        return dt.name
    raise TypeError(
        f"unsupported dtype {dt}; actcodec encodes float16, bfloat16 (ml_dtypes, or uint16 "
        f"with dtype='bfloat16'), float32, float64 and (raw, mask) bool"
    )


def canonical_name(dtype) -> str:
    """A codec dtype name from a name, numpy dtype or type ("bfloat16" included)."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    if dtype == "bfloat16" or (_BF16 is not None and np.dtype(dtype) == _BF16):
        return "bfloat16"
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise TypeError(f"unsupported dtype {dtype!r}")
    return name


def itemsize(name: str) -> int:
    return DTYPES[name][1]


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype a decoded array of this codec dtype has."""
    if name == "bfloat16" and _BF16 is not None:
        return _BF16
    return DTYPES[name][2]


def bits_view(arr: np.ndarray) -> np.ndarray:
    """Flat, C-contiguous unsigned-integer view of the element bits (copies only if strided)."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    return flat.view(np.dtype(f"u{arr.dtype.itemsize}"))


def require(name: str, allowed: tuple, codec: str) -> None:
    """A TypeError when codec `codec` does not take elements of type `name`."""
    if name not in allowed:
        raise TypeError(f"the {codec} codec encodes {', '.join(allowed)}, not {name}")


def prune_abs_bits(threshold: float, name: str) -> int:
    """Bit pattern of the smallest representable value >= threshold, so that for every element
    x of that dtype, |x| < threshold  <=>  (bits(x) & ~sign) < result. 0 means no pruning."""
    if not isinstance(threshold, (int, float, np.floating)) or isinstance(threshold, bool):
        raise TypeError(f"prune threshold must be a number, got {type(threshold).__name__}")
    t = float(threshold)
    if math.isnan(t) or t < 0:
        raise ValueError(f"prune threshold must be >= 0, got {threshold}")
    if t == 0:
        return 0
    if name == "bfloat16":
        f32 = _ceil_to(np.float32, t)
        bits = int(np.array(f32, np.float32).view(np.uint32))
        hi = bits >> 16
        return min(hi + (1 if bits & 0xFFFF else 0), 0x7F80)  # past the largest finite: inf
    ftype = {"float16": np.float16, "float32": np.float32, "float64": np.float64}[name]
    v = _ceil_to(ftype, t)
    return int(np.array(v, ftype).view(f"u{np.dtype(ftype).itemsize}"))


def _ceil_to(ftype, t: float):
    """Smallest value of float type `ftype` that is >= t (inf if t exceeds the range)."""
    with np.errstate(over="ignore"):
        v = ftype(t)
    if float(v) < t:
        v = np.nextafter(v, ftype(np.inf))
    return v
