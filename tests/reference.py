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


# ---- dynamic k-bit quantization (csrc/quant*.c), the same float32 math in numpy ----

M32 = np.uint32


def mix32(x):
    x = np.asarray(x, np.uint32).copy()
    with np.errstate(over="ignore"):
        x ^= x >> M32(16)
        x *= M32(0x7FEB352D)
        x ^= x >> M32(15)
        x *= M32(0x846CA68B)
        x ^= x >> M32(16)
    return x


def uniform(seed: int, index: np.ndarray) -> np.ndarray:
    """ac_uniform for an array of element indices: 24 hashed bits scaled to [0, 1)."""
    index = np.asarray(index, np.uint64)
    hi = (index >> np.uint64(32)).astype(np.uint32)
    lo = (index & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    with np.errstate(over="ignore"):
        key = mix32(M32(seed & 0xFFFFFFFF) ^ mix32(M32(seed >> 32) ^ mix32(hi + M32(0x9E3779B9))))
        bits = mix32((lo * M32(0x9E3779B1)) ^ key) >> M32(8)
    return bits.astype(np.float32) * np.float32(2.0**-24)


def to_f32(bits: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "float16":
            return bits.view(np.float16).astype(np.float32)
        if name == "bfloat16":
            return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
        if name == "float64":
            return bits.view(np.float64).astype(np.float32)
        return bits.view(np.float32)


def from_f32(y: np.ndarray, name: str) -> np.ndarray:
    """float32 -> bit patterns of `name`, rounding to nearest even."""
    if name == "float16":
        return y.astype(np.float16).view(np.uint16)
    if name == "bfloat16":
        u = y.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)
    if name == "float64":
        return y.astype(np.float64).view(np.uint64)
    return y.view(np.uint32)


def quant_encode(bits: np.ndarray, name: str, nbits: int, group, rounding: str, seed: int):
    """(codes uint8, mins float32, scales float32) for a flat bit-pattern array."""
    x = to_f32(bits, name)
    n = x.size
    G = group or max(n, 1)
    L = np.float32(2**nbits - 1)
    codes = np.empty(n, np.uint8)
    mins, scales = [], []
    u = uniform(seed, np.arange(n, dtype=np.uint64)) if rounding == "stochastic" else None
    for gs in range(0, n, G):
        seg = x[gs:gs + G]
        mn = np.float32(seg.min()) + np.float32(0)  # +0.0: the canonical zero, as in quant.c
        mx = np.float32(seg.max()) + np.float32(0)
        scale = np.float32(mx - mn) / L
        with np.errstate(over="ignore", divide="ignore"):
            inv = np.float32(1) / scale if scale > 0 else np.float32(0)
        # a scale whose inverse overflows float32 is divided by instead (quant.c does the same)
        t = (seg - mn) / scale if np.isinf(inv) else (seg - mn) * inv
        c = np.rint(t) if rounding == "nearest" else np.floor(t + u[gs:gs + G])
        codes[gs:gs + G] = np.minimum(c, L).astype(np.uint8)
        mins.append(mn)
        scales.append(scale)
    return codes, np.array(mins, np.float32), np.array(scales, np.float32)


def quant_pack(codes: np.ndarray, nbits: int) -> np.ndarray:
    """Unified layout: byte j of each 32-byte block holds codes j + 32 i at bit nbits * i."""
    per = 256 // nbits
    n = codes.size
    nblocks = -(-n // per)
    padded = np.zeros(nblocks * per, np.uint8)
    padded[:n] = codes
    planes = padded.reshape(nblocks, 8 // nbits, 32).astype(np.uint16)
    shifts = (np.arange(8 // nbits, dtype=np.uint16) * nbits)[None, :, None]
    packed = (planes << shifts).sum(axis=1).astype(np.uint8).reshape(-1)
    rem = n % per
    size = n // per * 32 + min(rem, 32)
    return packed[:size]


def quant_decode(codes, mins, scales, group, n) -> np.ndarray:
    G = group or max(n, 1)
    g = np.arange(n) // G
    return mins[g] + codes.astype(np.float32) * scales[g]
