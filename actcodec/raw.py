"""Raw codec: the elements stored as they are. It is what "compression does not pay" falls
back to, and it gives every array the same container and byte format.

Buffers: [elements]."""
from __future__ import annotations

import numpy as np

from . import _dtypes, container, encoder
from .abc import Codec


class Raw(Codec):
    name = "raw"
    codec_id = 1
    dtypes = tuple(_dtypes.DTYPES)

    def nbytes(self, count: int, esize: int, params: dict | None) -> int:
        return count * esize

    def encode(self, flat, name, params, opts, alloc, work=None, bittrick=-1) -> tuple:
        data = alloc(flat.nbytes)
        data[...] = flat.view(np.uint8)
        return (data,), None

    def validate(self, enc) -> None:
        container.expect_buffers(enc, 1)
        want = enc.size * _dtypes.itemsize(enc.dtype)
        if enc.buffers[0].nbytes != want:
            raise ValueError(f"raw buffer has {enc.buffers[0].nbytes} bytes, {want} expected")

    def decode_into(self, enc, buffers, out_bytes, target, opts) -> None:
        out_bytes[...] = buffers[0]


def encode(x, *, dtype: str | None = None, threads: int | None = None,
           simd: str | None = None) -> container.Encoded:
    """A copy of the elements of a numpy array or tensor, in the container."""
    return encoder.encode(x, "raw", dtype=dtype, threads=threads, simd=simd)
