"""The codec choice: from counts, the smallest encoding a caller's lossiness allows.

Pure functions over the registered codecs' size models (actcodec.abc): `bits=None` allows the
lossless codecs (raw, bitmap, mask), `bits=k` adds k-bit quantization, dense and of the
nonzero values only (quant, bitmap_quant). Sizes are exact, from the element count, the
number of nonzero bit patterns and whether those are all one value (a mask); ties go to the
lossless codec. Counting is the encoder's job (actcodec.encoder), on the data's own side.
"""
from __future__ import annotations

from .registry import CODECS

NAMES = ("auto", "raw", "bitmap", "mask", "quant", "bitmap_quant")
LOSSY = ("quant", "bitmap_quant")


def sizes_from_counts(n: int, nnz: int, esize: int, bits: int | None,
                      group_size: int | None = 256, one_value: bool = False) -> dict:
    """Exact payload bytes of each codec `bits` allows, for n elements with nnz nonzero
    (one_value: all of them one bit pattern, so the mask codec applies)."""
    params = None if bits is None else {"bits": bits, "group_size": group_size}
    bitmap_bytes = (n + 7) // 8
    out = {}
    for name, codec in CODECS.items():
        if codec.lossy and bits is None:
            continue
        if not codec.sparse:
            out[name] = codec.nbytes(n, esize, params)
        elif codec.values is not None:
            out[name] = bitmap_bytes + CODECS[codec.values].nbytes(nnz, esize, params)
        elif one_value:
            out[name] = bitmap_bytes + esize
    return out


def smallest(sizes: dict) -> str:
    """The smallest codec; ties go to a lossless one."""
    return min(sizes, key=lambda c: (sizes[c], c in LOSSY))


def sparse_can_win(sizes: dict) -> bool:
    """Whether a codec that needs the bitmap pass is the smallest of `sizes`."""
    return CODECS[smallest(sizes)].sparse
