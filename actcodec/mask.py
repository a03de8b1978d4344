"""Mask codec: a tensor whose nonzero elements all have one bit pattern (0/1 and bool masks,
dropout's scaled masks) as its bitmap plus that one value, exactly, at 1 bit per element.

Buffers: [bitmap, value]. The bitmap is the bitmap codec's; value holds one element (the
pattern every set bit decodes to; a bool mask's is 1). Unset bits decode to all-zero bits.
"""
from __future__ import annotations

import struct
import sys

import numpy as np

from . import _alloc, _dtypes, _ext, container

CODEC_ID = 5
DTYPES = (*_dtypes.FLOATS, "bool")
DECODES_TO_FLOAT32 = False
PARAMS = struct.Struct("<")


def params_to_tuple(params: dict) -> tuple:
    return ()


def params_from_tuple(values: tuple) -> dict:
    return {}


def encode(x, *, dtype: str | None = None, threads: int | None = None,
           simd: str | None = None) -> container.Encoded:
    """Encode a mask (ValueError if two nonzero elements differ)."""
    from . import choice

    return choice.encode(x, "mask", dtype=dtype, threads=threads, simd=simd)


def encode_flat(bits: np.ndarray, opts: dict, alloc) -> tuple:
    """(bitmap, value, nnz, whether the nonzero elements are one value) of a flat bit view
    (C path, one pass), in one block. Without one value, the buffers are not a mask. One-byte
    elements are bools: every nonzero byte is True, whose value is 1."""
    n, esize = bits.size, bits.itemsize
    sizes = [(n + 7) // 8, esize]
    bitmap, value = _alloc.carve(alloc(_alloc.offsets(sizes)[1]), sizes)
    nnz, one = _ext.mask_encode(bits.view(np.uint8), esize, bitmap, value, **opts)
    if esize == 1:
        value[0], one = 1, True
    return bitmap, value, nnz, one


def one_value(values: np.ndarray) -> bool:
    """Whether a non-empty run of bit patterns holds one value only. Activations differ
    within their first few values, so a short prefix settles most before the full pass."""
    if not values.size:
        return False
    first = values[0]
    return bool((values[:64] == first).all() and (values == first).all())


def validate(enc: container.Encoded) -> int:
    container.expect_buffers(enc, 2)
    bitmap, value = enc.buffers
    esize = _dtypes.itemsize(enc.dtype)
    if value.nbytes != esize:
        raise ValueError(f"a mask's value is one {enc.dtype} element ({esize} bytes), got "
                         f"{value.nbytes}")
    if enc.dtype == "bool" and value[0] != 1:
        raise ValueError(f"a bool mask's value must be 1, got {value[0]}")
    return container.bitmap_nnz(enc, bitmap)


def decode_into(enc, buffers, out_bytes: np.ndarray, target: str, opts: dict) -> None:
    bitmap, value = buffers
    _ext.mask_decode(bitmap, value, out_bytes, **opts)


container.register("mask", sys.modules[__name__])
