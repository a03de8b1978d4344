"""Codec choice: the smallest encoding among those the caller's lossiness allows.

`bits=None` allows only lossless codecs ({bitmap, raw}); `bits=k` adds k-bit quantization, dense
and of the nonzero values only ({quant, bitmap_quant, bitmap, raw}). Sizes are computed
exactly from the element count and the number of nonzero bit patterns, so the choice costs one
counting pass over the input; ties go to the lossless codec.
"""
from __future__ import annotations

import numpy as np

from . import _dtypes, bitmap, bitmap_quant, quant, raw


def sizes_from_counts(n: int, nnz: int, esize: int, bits: int | None,
                      group_size: int | None = 256) -> dict:
    """Exact payload bytes of each codec `bits` allows, for n elements with nnz nonzero."""
    out = {"raw": n * esize, "bitmap": (n + 7) // 8 + nnz * esize}
    if bits is not None:
        quant.check_params(bits, group_size, "nearest", "raise", 0)

        def q(count):
            return quant.packed_nbytes(count, bits) + 8 * quant.ngroups(count, group_size)
        out["quant"] = q(n)
        out["bitmap_quant"] = (n + 7) // 8 + q(nnz)
    return out


def smallest(sizes: dict) -> str:
    """The smallest codec; ties go to the lossless one."""
    return min(sizes, key=lambda c: (sizes[c], c not in ("raw", "bitmap")))


def sizes(x, bits: int | None, group_size: int | None = 256, dtype: str | None = None) -> dict:
    """Exact payload bytes each allowed codec would produce for x."""
    arr = np.asarray(x)
    _dtypes.dtype_name(arr, dtype)  # a clear error for unsupported dtypes
    bits_view = _dtypes.bits_view(arr)
    return sizes_from_counts(bits_view.size, int(np.count_nonzero(bits_view)),
                             bits_view.itemsize, bits, group_size)


def choose(x, bits: int | None, group_size: int | None = 256, dtype: str | None = None) -> str:
    return smallest(sizes(x, bits, group_size, dtype))


def encode(x, codec: str = "auto", *, bits: int | None = None, group_size: int | None = 256,
           rounding: str = "nearest", seed: int = 0, nonfinite: str = "raise",
           prune: float = 0.0, dtype: str | None = None):
    """Encode with a named codec, or with codec="auto" the smallest one `bits` allows."""
    if codec == "auto":
        codec = choose(x, bits, group_size, dtype)
    if codec == "raw":
        return raw.encode(x, dtype=dtype)
    if codec == "bitmap":
        return bitmap.encode(x, prune=prune, dtype=dtype)
    if codec in ("quant", "bitmap_quant"):
        if bits is None:
            raise ValueError(f"codec {codec!r} is lossy: pass bits=1, 2, 4 or 8")
        mod = quant if codec == "quant" else bitmap_quant
        return mod.encode(x, bits, group_size=group_size, rounding=rounding, seed=seed,
                          nonfinite=nonfinite, dtype=dtype)
    raise ValueError(f"unknown codec {codec!r}; choose auto, raw, bitmap, quant or bitmap_quant")
