"""Raw codec: the elements stored as they are. It is what "compression does not pay" falls
back to, and it gives every array the same container and byte format."""
from __future__ import annotations

import struct
import sys

import numpy as np

from . import _dtypes, container

CODEC_ID = 1
PARAMS = struct.Struct("<")


def params_to_tuple(params: dict) -> tuple:
    return ()


def params_from_tuple(values: tuple) -> dict:
    return {}


def encode(x, *, dtype: str | None = None) -> container.Encoded:
    arr = np.asarray(x)
    name = _dtypes.dtype_name(arr, dtype)
    data = _dtypes.bits_view(arr).view(np.uint8).copy()
    return container.Encoded("raw", name, tuple(arr.shape), {}, (data,))


def validate(enc: container.Encoded) -> None:
    container.expect_buffers(enc, 1)
    want = enc.size * _dtypes.itemsize(enc.dtype)
    if enc.buffers[0].nbytes != want:
        raise ValueError(f"raw buffer has {enc.buffers[0].nbytes} bytes, {want} expected")


def decode_into(enc: container.Encoded, out_bytes: np.ndarray, out_name: str) -> None:
    out_bytes[...] = enc.buffers[0]


container.register("raw", sys.modules[__name__])
