"""Slow, obviously-correct numpy references the kernels are checked against."""
import numpy as np

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
ABS_MASK = {2: 0x7FFF, 4: 0x7FFFFFFF, 8: 0x7FFFFFFFFFFFFFFF}


def bits_of(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1).view(UINT[x.dtype.itemsize])


def bitmap_encode(x: np.ndarray, prune_bits: int = 0):
    """packbits + boolean indexing: (bitmap bytes, value bytes)."""
    bits = bits_of(x)
    if prune_bits:
        nz = (bits & ABS_MASK[bits.itemsize]) >= prune_bits
    else:
        nz = bits != 0
    return np.packbits(nz, bitorder="little"), bits[nz].view(np.uint8)


def bitmap_decode(bitmap: np.ndarray, values: np.ndarray, n: int, itemsize: int) -> np.ndarray:
    nz = np.unpackbits(bitmap, count=n, bitorder="little").astype(bool)
    out = np.zeros(n, UINT[itemsize])
    out[nz] = values.view(UINT[itemsize])
    return out


def prune_by_value(x: np.ndarray, t: float, dtype_name: str) -> np.ndarray:
    """What pruning means for values: |x| < t becomes +0.0; everything else (NaN too) stays."""
    bits = bits_of(x)
    with np.errstate(invalid="ignore"):  # casting signalling NaNs warns; they stay NaN
        if dtype_name == "bfloat16":
            values = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            values = x.reshape(-1).astype(np.float64)
        small = np.abs(values) < t
    out = bits.copy()
    out[small] = 0
    return out


MASK64 = (1 << 64) - 1
K1 = 0x9E3779B97F4A7C15
K2 = 0xD6E8FEB86659FD93


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & MASK64


def _mix(acc, w):
    return (_rotl((acc + w * K2) & MASK64, 29) * K1) & MASK64


def checksum64(data: bytes, seed: int = 0) -> int:
    """Pure-Python statement of csrc/checksum.c."""
    n = len(data)
    a, b, c, d = (seed + K1) & MASK64, seed ^ K2, (seed + 1) & MASK64, (seed - K1) & MASK64
    word = lambda i: int.from_bytes(data[i:i + 8], "little")  # noqa: E731
    i = 0
    while i + 32 <= n:
        a, b, c, d = _mix(a, word(i)), _mix(b, word(i + 8)), _mix(c, word(i + 16)), _mix(d, word(i + 24))
        i += 32
    h = (_rotl(a, 1) + _rotl(b, 7) + _rotl(c, 12) + _rotl(d, 18)) & MASK64
    h ^= (n * K1) & MASK64
    while i + 8 <= n:
        h = _mix(h, word(i))
        i += 8
    while i < n:
        h = _mix(h, data[i] + 1)
        i += 1
    h ^= h >> 32
    h = (h * K2) & MASK64
    h ^= h >> 29
    h = (h * K1) & MASK64
    h ^= h >> 32
    return h
