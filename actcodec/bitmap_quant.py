"""Sparse + quantized codec for ReLU-sparse activations: the bitmap of nonzero elements (kept
exactly, so zeros stay exact zeros) plus k-bit quantization of only the nonzero values.

Buffers: [bitmap] followed by the quantized buffers of the values array (see quant.py);
stochastic rounding draws by the index within the values array.
"""
from __future__ import annotations

import numpy as np

from . import _dtypes, _ext, bitmap, container, encoder, quant
from .abc import Codec


class BitmapQuant(Codec):
    name = "bitmap_quant"
    codec_id = 4
    dtypes = _dtypes.FLOATS
    lossy = True
    decodes_to_float32 = True
    params_struct = quant.PARAMS
    sparse = True
    values = "quant"

    def params_to_tuple(self, params: dict) -> tuple:
        return quant.params_to_tuple(params)

    def params_from_tuple(self, values: tuple) -> dict:
        return quant.params_from_tuple(values)

    def encode(self, flat, name, params, opts, alloc, work=None, bittrick=-1) -> tuple:
        """The bitmap and the quantized values in a block of their own, so the full values
        (in the bitmap pass's block, `work` when the encoder's survey made it) go with it."""
        bm, values, nnz = work if work is not None else bitmap.scan(flat, 0, opts, alloc)
        return quant.quantize_flat(values.view(flat.dtype), name, params, opts, alloc,
                                   bittrick, bm), nnz

    def validate(self, enc) -> int:
        if len(enc.buffers) not in (4, 6):
            raise ValueError(f"bitmap_quant encoding needs 4 or 6 buffers, has "
                             f"{len(enc.buffers)}")
        nnz = bitmap.nonzero_count(enc, enc.buffers[0])
        quant.validate_flat(enc.buffers[1:], nnz, enc.dtype, enc.params)
        return nnz

    def decode_into(self, enc, buffers, out_bytes, target, opts) -> None:
        """Dequantize the values, then place them: the bitmap is counted once (in decode,
        which checks it against the values it is given)."""
        nnz = bitmap.nonzero_count(enc, buffers[0])
        esize = _dtypes.DTYPES[target][1]
        values = np.empty(nnz * esize, np.uint8)
        quant.dequantize_flat(buffers[1:], nnz, enc.dtype, target, enc.params, values, opts)
        _ext.bitmap_decode(buffers[0], values, esize, out_bytes, **opts)


def encode(x, bits: int = 8, *, group_size: int | None = 256, rounding: str = "nearest",
           seed: int = 0, nonfinite: str = "raise", dtype: str | None = None,
           threads: int | None = None, simd: str | None = None) -> container.Encoded:
    """The bitmap of the nonzero elements of a float array or tensor, and their values
    quantized to `bits` bits per group."""
    return encoder.encode(x, "bitmap_quant", bits=bits, group_size=group_size,
                          rounding=rounding, seed=seed, nonfinite=nonfinite, dtype=dtype,
                          threads=threads, simd=simd)
