"""Sparse bitmap codec (BitTrain): one bit per element marks "nonzero", and the nonzero
elements are stored densely, in order.

"Zero" is decided on the bit pattern, not with a float compare, so the round trip is bit-exact
for every value: -0.0, NaN payloads, infinities and subnormals all come back unchanged. An
optional prune threshold (off by default, lossy) stores |x| < threshold as +0.0.

Buffers: [bitmap, values]. Bit i of the bitmap is bit (i % 8) of byte i // 8 (LSB first, as
``np.packbits(..., bitorder="little")``); padding bits after the last element are zero.
Non-contiguous input is copied once into a contiguous buffer before encoding.
"""
from __future__ import annotations

import struct
import sys

import numpy as np

from . import _dtypes, _ext, _outputs, container

CODEC_ID = 2
PARAMS = struct.Struct("<d")  # prune threshold (0.0 = lossless)


def params_to_tuple(params: dict) -> tuple:
    return (float(params["prune"]),)


def params_from_tuple(values: tuple) -> dict:
    (prune,) = values
    if not (prune >= 0.0 and prune != float("inf")):  # also rejects NaN
        raise ValueError(f"bitmap prune threshold must be finite and >= 0, got {prune}")
    return {"prune": prune}


def encode(x, *, prune: float = 0.0, dtype: str | None = None) -> container.Encoded:
    """Encode a float16/bfloat16/float32/float64 array. `prune` > 0 stores |x| < prune as zero
    (lossy). `dtype="bfloat16"` tags uint16 input as bfloat16 bit patterns."""
    arr = np.asarray(x)
    name = _dtypes.dtype_name(arr, dtype)
    thr = _dtypes.prune_abs_bits(prune, name)
    bits = _dtypes.bits_view(arr)
    bitmap, values = _ext.bitmap_encode(bits.view(np.uint8), bits.itemsize, thr,
                                        _outputs.own_mapping(bits.nbytes))
    return container.Encoded("bitmap", name, tuple(arr.shape), {"prune": float(prune)},
                             (bitmap, values))


def decode(enc: container.Encoded, out: np.ndarray | None = None) -> np.ndarray:
    """Decode a bitmap encoding into a new array or into `out`."""
    if enc.codec != "bitmap":
        raise ValueError(f"not a bitmap encoding: codec {enc.codec!r}")
    return enc.decode(out)


def validate(enc: container.Encoded) -> None:
    """Check an encoding parsed from bytes before anything decodes it."""
    container.expect_buffers(enc, 2)
    bitmap, values = enc.buffers
    n, esize = enc.size, _dtypes.itemsize(enc.dtype)
    if bitmap.nbytes != (n + 7) // 8:
        raise ValueError(f"bitmap has {bitmap.nbytes} bytes, {(n + 7) // 8} expected for "
                         f"{n} elements")
    if values.nbytes % esize or values.nbytes // esize > n:
        raise ValueError(f"values buffer of {values.nbytes} bytes does not hold at most {n} "
                         f"{enc.dtype} elements")
    nnz = _ext.bitmap_count(bitmap, n)
    if nnz * esize != values.nbytes:
        raise ValueError(f"bitmap marks {nnz} nonzero elements but the values buffer holds "
                         f"{values.nbytes // esize}")


def decode_into(enc: container.Encoded, out_bytes: np.ndarray, out_name: str) -> None:
    bitmap, values = enc.buffers
    _ext.bitmap_decode(bitmap, values, _dtypes.itemsize(enc.dtype), out_bytes)


container.register("bitmap", sys.modules[__name__])
