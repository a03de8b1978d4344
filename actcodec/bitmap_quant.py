"""Sparse + quantized codec for ReLU-sparse activations: the bitmap of nonzero elements (kept
exactly, so zeros stay exact zeros) plus k-bit quantization of only the nonzero values.

Buffers: [bitmap] followed by the quantized buffers of the values array (see quant.py);
stochastic rounding draws by the index within the values array.
"""
from __future__ import annotations

import sys

import numpy as np

from . import _dtypes, container, quant

CODEC_ID = 4
DTYPES = _dtypes.FLOATS
DECODES_TO_FLOAT32 = True
PARAMS = quant.PARAMS
params_to_tuple = quant.params_to_tuple
params_from_tuple = quant.params_from_tuple


def encode(x, bits: int = 8, *, group_size: int | None = 256, rounding: str = "nearest",
           seed: int = 0, nonfinite: str = "raise", dtype: str | None = None,
           threads: int | None = None, simd: str | None = None) -> container.Encoded:
    """The bitmap of the nonzero elements of a float array or tensor, and their values
    quantized to `bits` bits per group."""
    from . import choice

    return choice.encode(x, "bitmap_quant", bits=bits, group_size=group_size,
                         rounding=rounding, seed=seed, nonfinite=nonfinite, dtype=dtype,
                         threads=threads, simd=simd)


def validate(enc: container.Encoded) -> int:
    if len(enc.buffers) not in (4, 6):
        raise ValueError(f"bitmap_quant encoding needs 4 or 6 buffers, has {len(enc.buffers)}")
    nnz = container.bitmap_nnz(enc, enc.buffers[0])
    quant.validate_flat(enc.buffers[1:], nnz, enc.dtype, enc.params)
    return nnz


def decode_into(enc, buffers, out_bytes: np.ndarray, target: str, opts: dict) -> None:
    """Dequantize the values, then place them: the bitmap is counted once (in decode, which
    checks it against the values it is given)."""
    from . import _ext

    nnz = container.bitmap_nnz(enc, buffers[0])
    esize = _dtypes.itemsize(target)
    values = np.empty(nnz * esize, np.uint8)
    quant.dequantize_flat(buffers[1:], nnz, enc.dtype, target, enc.params, values, opts)
    _ext.bitmap_decode(buffers[0], values, esize, out_bytes, **opts)


container.register("bitmap_quant", sys.modules[__name__])
