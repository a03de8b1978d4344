"""Mask codec: a tensor whose nonzero elements all have one bit pattern (0/1 and bool masks,
dropout's scaled masks) as its bitmap plus that one value, exactly, at 1 bit per element.

Buffers: [bitmap, value]. The bitmap is the bitmap codec's; value holds one element (the
pattern every set bit decodes to; a bool mask's is 1). Unset bits decode to all-zero bits.
"""
from __future__ import annotations

import numpy as np

from . import _alloc, _dtypes, _ext, container, encoder
from .abc import Codec
from .bitmap import nonzero_count


class Mask(Codec):
    name = "mask"
    codec_id = 5
    dtypes = (*_dtypes.FLOATS, "bool")
    sparse = True
    values = None  # one element

    def encode(self, flat, name, params, opts, alloc, work=None, bittrick=-1) -> tuple:
        """`work`: the encoder's mask pass over the same data, reused."""
        if work is None or len(work) != 4:  # not the mask pass (the bitmap pass's, or none)
            work = scan(flat, opts, alloc)
        bm, value, nnz, one = work
        if not one:
            raise ValueError("not a mask: its nonzero elements differ (use bitmap)")
        return (bm, value), nnz

    def scan(self, bits, opts, alloc) -> tuple:
        return scan(bits, opts, alloc)

    def validate(self, enc) -> int:
        container.expect_buffers(enc, 2)
        bm, value = enc.buffers
        esize = _dtypes.itemsize(enc.dtype)
        if value.nbytes != esize:
            raise ValueError(f"a mask's value is one {enc.dtype} element ({esize} bytes), got "
                             f"{value.nbytes}")
        if enc.dtype == "bool" and value[0] != 1:
            raise ValueError(f"a bool mask's value must be 1, got {value[0]}")
        return nonzero_count(enc, bm)

    def decode_into(self, enc, buffers, out_bytes, target, opts) -> None:
        bm, value = buffers
        _ext.mask_decode(bm, value, out_bytes, **opts)


def scan(bits: np.ndarray, opts: dict, alloc) -> tuple:
    """(bitmap, value, nnz, whether the nonzero elements are one value) of a flat bit view
    (C path, one pass), in one block. Without one value, the buffers are not a mask. One-byte
    elements are bools: every nonzero byte is True, whose value is 1."""
    n, esize = bits.size, bits.itemsize
    sizes = [(n + 7) // 8, esize]
    bm, value = _alloc.carve(alloc(_alloc.offsets(sizes)[1]), sizes)
    nnz, one = _ext.mask_encode(bits.view(np.uint8), esize, bm, value, **opts)
    if esize == 1:
        value[0], one = 1, True
    return bm, value, nnz, one


def encode(x, *, dtype: str | None = None, threads: int | None = None,
           simd: str | None = None) -> container.Encoded:
    """Encode a mask (ValueError if two nonzero elements differ)."""
    return encoder.encode(x, "mask", dtype=dtype, threads=threads, simd=simd)
