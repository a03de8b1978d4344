"""Sparse bitmap codec (BitTrain): one bit per element marks "nonzero", and the nonzero
elements are stored densely, in order.

"Zero" is decided on the bit pattern, not with a float compare, so the round trip is bit-exact
for every value: -0.0, NaN payloads, infinities and subnormals all come back unchanged. An
optional prune threshold (off by default, lossy) stores |x| < threshold as +0.0.

Buffers: [bitmap, values]. Bit i of the bitmap is bit (i % 8) of byte i // 8 (LSB first, as
``np.packbits(..., bitorder="little")``); padding bits after the last element are zero.
"""
from __future__ import annotations

import struct

import numpy as np

from . import _alloc, _dtypes, _ext, backends, container, encoder
from .abc import Codec


class Bitmap(Codec):
    name = "bitmap"
    codec_id = 2
    dtypes = _dtypes.FLOATS
    params_struct = struct.Struct("<d")  # prune threshold (0.0 = lossless)
    sparse = True
    values = "raw"

    def params_to_tuple(self, params: dict) -> tuple:
        return (float(params["prune"]),)

    def params_from_tuple(self, values: tuple) -> dict:
        (prune,) = values
        if not (prune >= 0.0 and prune != float("inf")):  # also rejects NaN
            raise ValueError(f"bitmap prune threshold must be finite and >= 0, got {prune}")
        return {"prune": prune}

    def encode(self, flat, name, params, opts, alloc, work=None, bittrick=-1) -> tuple:
        """`work`: the encoder's bitmap pass over the same data, reused."""
        if work is None:
            thr = _dtypes.prune_abs_bits(params.get("prune", 0.0), name)
            work = scan(flat, thr, opts, alloc)
        elif not alloc.cuts_in_place:
            work = kept(work, alloc)  # the survey's pass, still in scratch
        bm, values, nnz = work
        return (bm, values), nnz

    def scan(self, bits, thr, opts, alloc, keep=True) -> tuple:
        return scan(bits, thr, opts, alloc, keep)

    def validate(self, enc) -> int:
        container.expect_buffers(enc, 2)
        bm, values = enc.buffers
        n, esize = enc.size, _dtypes.itemsize(enc.dtype)
        if values.nbytes % esize or values.nbytes // esize > n:
            raise ValueError(f"values buffer of {values.nbytes} bytes does not hold at most {n} "
                             f"{enc.dtype} elements")
        nnz = nonzero_count(enc, bm)
        if nnz * esize != values.nbytes:
            raise ValueError(f"bitmap marks {nnz} nonzero elements but the values buffer holds "
                             f"{values.nbytes // esize}")
        return nnz

    def decode_into(self, enc, buffers, out_bytes, target, opts) -> None:
        bm, values = buffers
        _ext.bitmap_decode(bm, values, _dtypes.itemsize(enc.dtype), out_bytes, **opts)


def scan(bits: np.ndarray, thr: int, opts: dict, alloc, keep: bool = True) -> tuple:
    """(bitmap, values, nnz) of a flat bit view (C path), in one block: a scratch block with
    room for every element, cut to the nonzero ones when `keep` (pages never written are
    never committed). Without `keep` the result stays in scratch (see `kept`)."""
    n, esize = bits.size, bits.itemsize
    nb = (n + 7) // 8
    (_, at), total = _alloc.offsets([nb, n * esize])
    block = alloc.scratch(total)
    nnz = _ext.bitmap_encode(bits.view(np.uint8), esize, thr, block[:nb], block[at:], **opts)
    if keep:
        block = alloc.shrink(block, at + nnz * esize)
    bm, values = _alloc.carve(block, [nb, nnz * esize])
    return bm, values, nnz


def kept(work: tuple, alloc) -> tuple:
    """A `scan` result left in scratch, copied into a block of `alloc` of its size."""
    bm, values, nnz = work
    sizes = [bm.nbytes, values.nbytes]
    new_bitmap, new_values = _alloc.carve(alloc(_alloc.offsets(sizes)[1]), sizes)
    new_bitmap[:], new_values[:] = bm, values
    return new_bitmap, new_values, nnz


def nonzero_count(enc, bm) -> int:
    """The nonzero count of a bitmap codec's encoding: known, or counted once (and checked:
    padding bits zero, the bitmap's size)."""
    if enc.nnz is not None:
        return enc.nnz
    n = enc.size
    if bm.nbytes != (n + 7) // 8:
        raise ValueError(f"bitmap has {bm.nbytes} bytes, {(n + 7) // 8} expected for {n} "
                         f"elements")
    return _ext.bitmap_count(backends.to_numpy(bm), n)


def encode(x, *, prune: float = 0.0, dtype: str | None = None, threads: int | None = None,
           simd: str | None = None) -> container.Encoded:
    """Encode a float16/bfloat16/float32/float64 array or tensor. `prune` > 0 stores
    |x| < prune as zero (lossy). `dtype="bfloat16"` tags uint16 input as bfloat16 bits."""
    return encoder.encode(x, "bitmap", prune=prune, dtype=dtype, threads=threads, simd=simd)


def decode(enc: container.Encoded, out=None, **options):
    """Decode a bitmap encoding into a new array or into `out`."""
    if enc.codec != "bitmap":
        raise ValueError(f"not a bitmap encoding: codec {enc.codec!r}")
    return enc.decode(out, **options)
