"""Raw codec: the elements stored as they are. It is what "compression does not pay" falls
back to, and it gives every array the same container and byte format.

Buffers: [elements]."""
from __future__ import annotations

import struct
import sys

import numpy as np

from . import _dtypes, container

CODEC_ID = 1
DTYPES = tuple(_dtypes.DTYPES)
DECODES_TO_FLOAT32 = False
PARAMS = struct.Struct("<")


def params_to_tuple(params: dict) -> tuple:
    return ()


def params_from_tuple(values: tuple) -> dict:
    return {}


def encode(x, *, dtype: str | None = None, threads: int | None = None,
           simd: str | None = None) -> container.Encoded:
    """A copy of the elements of a numpy array or tensor, in the container."""
    from . import choice

    return choice.encode(x, "raw", dtype=dtype, threads=threads, simd=simd)


def encode_flat(bits: np.ndarray, alloc) -> tuple:
    """The buffers of a flat bit view (C path)."""
    data = alloc(bits.nbytes)
    data[...] = bits.view(np.uint8)
    return (data,)


def validate(enc: container.Encoded) -> None:
    container.expect_buffers(enc, 1)
    want = enc.size * _dtypes.itemsize(enc.dtype)
    if enc.buffers[0].nbytes != want:
        raise ValueError(f"raw buffer has {enc.buffers[0].nbytes} bytes, {want} expected")


def decode_into(enc, buffers, out_bytes: np.ndarray, target: str, opts: dict) -> None:
    out_bytes[...] = buffers[0]


container.register("raw", sys.modules[__name__])
