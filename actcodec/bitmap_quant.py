"""Sparse + quantized codec for ReLU-sparse activations: the bitmap of nonzero elements (kept
exactly, so zeros stay exact zeros) plus k-bit quantization of only the nonzero values.

Buffers: [bitmap] followed by the quantized buffers of the values array (see quant.py);
stochastic rounding draws by the index within the values array.
"""
from __future__ import annotations

import sys

import numpy as np

from . import _dtypes, _ext, bitmap, container, quant

CODEC_ID = 4
DECODES_TO_FLOAT32 = True
PARAMS = quant.PARAMS
params_to_tuple = quant.params_to_tuple
params_from_tuple = quant.params_from_tuple


def encode(x, bits: int = 8, *, group_size: int | None = 256, rounding: str = "nearest",
           seed: int = 0, nonfinite: str = "raise", dtype: str | None = None) -> container.Encoded:
    p = quant.check_params(bits, group_size, rounding, nonfinite, seed)
    return from_bitmap(bitmap.encode(x, dtype=dtype), p)


def from_bitmap(lossless: container.Encoded, p: dict) -> container.Encoded:
    """Quantize the values of a lossless bitmap encoding (p: quant.check_params output)."""
    bitmap_buf, values = lossless.buffers
    values = values.view(f"u{_dtypes.itemsize(lossless.dtype)}")
    qbufs = quant.quantize_flat(values, lossless.dtype, p)
    return container.Encoded("bitmap_quant", lossless.dtype, lossless.shape, p,
                             (bitmap_buf, *qbufs))


def validate(enc: container.Encoded) -> None:
    if len(enc.buffers) not in (4, 6):
        raise ValueError(f"bitmap_quant encoding needs 4 or 6 buffers, has {len(enc.buffers)}")
    n = enc.size
    bitmap_buf = enc.buffers[0]
    if bitmap_buf.nbytes != (n + 7) // 8:
        raise ValueError(f"bitmap has {bitmap_buf.nbytes} bytes, {(n + 7) // 8} expected for "
                         f"{n} elements")
    nnz = _ext.bitmap_count(bitmap_buf, n)
    quant.validate_flat(enc.buffers[1:], nnz, enc.dtype, enc.params)


def decode_into(enc: container.Encoded, out_bytes: np.ndarray, out_name: str) -> None:
    bitmap_buf, qbufs = enc.buffers[0], enc.buffers[1:]
    nnz = _ext.bitmap_count(bitmap_buf, enc.size)
    esize = _dtypes.itemsize(out_name)
    values = np.empty(nnz * esize, np.uint8)
    quant.dequantize_flat(qbufs, nnz, enc.dtype, out_name, enc.params, values)
    _ext.bitmap_decode(bitmap_buf, values, esize, out_bytes)


container.register("bitmap_quant", sys.modules[__name__])
