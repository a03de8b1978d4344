"""Dynamic k-bit quantization (DAF, ActNN): per-group min-max, codes of 1, 2, 4 or 8 bits.

Per group of `group_size` consecutive elements (the last may be short; `group_size=None` means
one group for the whole tensor), in float32: mn = min, scale = (max - min) / (2^k - 1), and
code = round((x - mn) / scale), to nearest-even or stochastically (floor(t + u), with u drawn by
a stateless hash of (seed, element index), so every SIMD path and thread count gives the same
codes). Decoding gives mn + code * scale, so |x - x_hat| <= scale / 2 (nearest, plus float32
rounding) and < scale (stochastic). Constant groups (max == min) decode exactly (a group of
-0.0 decodes to +0.0). mins and scales are stored as float32, 8 bytes per group.

Non-finite input: by default a `NonFiniteError` (a ValueError) names the first NaN/inf element:
in a training step that is a bug the user wants to see. `nonfinite="keep"` instead stores such
elements exactly in an escape list beside the codes (their group's range is computed as if they
were 0). float64 input is quantized in float32; finite values beyond the float32 range count as
non-finite.

Buffers: [packed codes, mins, scales] plus [escape indices (uint64), escape values] when
escapes exist. Codes use the unified interleaved layout described in docs/FORMAT.md.
"""
from __future__ import annotations

import struct
import sys
from math import prod

import numpy as np

from . import _alloc, _dtypes, _ext, container, encoder
from .abc import Codec

# bits, rounding (0 nearest, 1 stochastic), nonfinite (0 raise, 1 keep), pad, group (0 = per
# tensor), seed
PARAMS = struct.Struct("<BBBxIQ")
BITS = (1, 2, 4, 8)
ROUNDINGS = ("nearest", "stochastic")
NONFINITE = ("raise", "keep")
GROUP_MIN, GROUP_MAX = 32, 65536
NonFiniteError = _ext.NonFiniteError

# The exponent bits of each float type: all set means NaN or inf. float64 beyond F32_MAX counts
# as non-finite too (quantization computes in float32).
EXPONENT = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000,
            "float64": 0x7FF0000000000000}
F32_MAX = float(np.finfo(np.float32).max)
# The stateless hash stochastic rounding draws from (csrc/codecs/quant_common.h): every path,
# the device path included, computes the same numbers from these.
HASH_GOLDEN, HASH_MUL1, HASH_MUL2, HASH_KEY_OFFSET = 0x9E3779B1, 0x7FEB352D, 0x846CA68B, 0x9E3779B9
U24_SCALE = 2.0 ** -24  # a 24-bit hash value times this: a uniform number in [0, 1)


def check_params(bits, group_size, rounding, nonfinite, seed) -> dict:
    """Validate user parameters; returns the normalized parameter dict."""
    if bits not in BITS or isinstance(bits, bool):
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or \
                not GROUP_MIN <= group_size <= GROUP_MAX:
            raise ValueError(f"group_size must be an integer from {GROUP_MIN} to {GROUP_MAX}, "
                             f"or None for one group per tensor; got {group_size!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if nonfinite not in NONFINITE:
        raise ValueError(f"nonfinite must be one of {NONFINITE}, got {nonfinite!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return {"bits": int(bits), "group_size": None if group_size is None else int(group_size),
            "rounding": rounding, "nonfinite": nonfinite, "seed": int(seed)}


def params_to_tuple(p: dict) -> tuple:
    return (p["bits"], ROUNDINGS.index(p["rounding"]), NONFINITE.index(p["nonfinite"]),
            p["group_size"] or 0, p["seed"])


def params_from_tuple(values: tuple) -> dict:
    bits, rounding, nonfinite, group, seed = values
    if rounding >= len(ROUNDINGS) or nonfinite >= len(NONFINITE):
        raise ValueError(f"unknown rounding {rounding} or nonfinite mode {nonfinite}")
    if group == 0:
        group = None
    try:
        return check_params(bits, group, ROUNDINGS[rounding], NONFINITE[nonfinite], seed)
    except ValueError as exc:
        raise ValueError(f"bad quantization parameters: {exc}") from None


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes of `count` packed codes (ac_quant_packed_nbytes, in Python integers so that a
    corrupted, absurd count from untrusted bytes cannot overflow)."""
    per = 256 // bits
    return count // per * 32 + min(count % per, 32)


def ngroups(count: int, group: int | None) -> int:
    """Groups of `group` elements in `count` (None: one group); ac_quant_ngroups in Python."""
    if count == 0:
        return 0
    return 1 if not group or group >= count else -(-count // group)


def _nonfinite_mask(bits: np.ndarray, name: str) -> np.ndarray:
    """Elements that are NaN/inf (exponent all ones), or float64 beyond the float32 range."""
    exp = EXPONENT[name]
    mask = (bits & bits.dtype.type(exp)) == exp
    if name == "float64":
        with np.errstate(invalid="ignore"):
            mask |= np.abs(bits.view(np.float64)) > F32_MAX
    return mask


def quantize_flat(bits: np.ndarray, name: str, p: dict, opts: dict, alloc,
                  bittrick: int = -1, head: np.ndarray | None = None) -> list:
    """Quantize a flat uint view of `name` elements (C path); returns the buffer list, in one
    block, after a copy of `head` (bitmap_quant's bitmap) when given."""
    wire, esize, _ = _dtypes.DTYPES[name]
    escapes = []
    if p["nonfinite"] == "keep":
        mask = _nonfinite_mask(bits, name)
        if mask.any():
            idx = np.flatnonzero(mask).astype("<u8")
            escapes = [idx.view(np.uint8), bits[idx].view(np.uint8).copy()]
            bits = bits.copy()
            bits[idx] = 0
    n, group = bits.size, p["group_size"] or 0
    ng = _ext.quant_ngroups(n, group)
    sizes = ([] if head is None else [head.nbytes]) + [packed_nbytes(n, p["bits"]), 4 * ng, 4 * ng]
    bufs = _alloc.carve(alloc(_alloc.offsets(sizes)[1]), sizes)
    if head is not None:
        bufs[0][...] = head
    packed, mins, scales = bufs[-3:]
    _ext.quant_encode(bits.view(np.uint8), wire, esize, p["bits"], group,
                      ROUNDINGS.index(p["rounding"]), p["seed"], packed, mins.view(np.float32),
                      scales.view(np.float32), bittrick=bittrick, **opts)
    return [*bufs, *escapes]


def _floats(buf: np.ndarray) -> np.ndarray:
    f = buf.view("<f4")
    return f if f.flags.aligned else f.copy()


def dequantize_flat(buffers, count: int, name: str, out_name: str, p: dict,
                    out_bytes: np.ndarray, opts: dict, bittrick: int = -1) -> None:
    """Decode `count` elements from quantize_flat's buffers into out_bytes (out_name dtype)."""
    wire, esize, _ = _dtypes.DTYPES[out_name]
    packed, mins, scales = buffers[:3]
    _ext.quant_decode(packed, _floats(mins), _floats(scales), p["bits"], p["group_size"] or 0,
                      wire, esize, out_bytes, bittrick=bittrick, **opts)
    if len(buffers) == 5:
        idx = buffers[3].view("<u8")
        vals = buffers[4].view(_dtypes.DTYPES[name][2] if name != "bfloat16" else np.uint16)
        out = out_bytes.view(f"u{esize}")
        out[idx] = _convert_bits(vals, name, out_name)


def _convert_bits(vals: np.ndarray, name: str, out_name: str) -> np.ndarray:
    """Escape values (bit patterns of `name`) as bit patterns of `out_name` (same or float32)."""
    if name == out_name:
        return vals.view(f"u{vals.itemsize}")
    if name == "bfloat16":
        return vals.astype(np.uint32) << 16
    with np.errstate(over="ignore", invalid="ignore"):
        return vals.astype(np.float32).view(np.uint32)


def validate_flat(buffers, count: int, name: str, p: dict) -> None:
    """Check quantize_flat buffers for `count` elements before anything decodes them."""
    if len(buffers) not in (3, 5):
        raise ValueError(f"quantized data needs 3 or 5 buffers, has {len(buffers)}")
    packed, mins, scales = buffers[:3]
    want = packed_nbytes(count, p["bits"])
    if packed.nbytes != want:
        raise ValueError(f"packed codes have {packed.nbytes} bytes, {want} expected for "
                         f"{count} {p['bits']}-bit codes")
    ng = ngroups(count, p["group_size"])
    if mins.nbytes != 4 * ng or scales.nbytes != 4 * ng:
        raise ValueError(f"{ng} groups need {4 * ng} bytes of mins and of scales, got "
                         f"{mins.nbytes} and {scales.nbytes}")
    mn, sc = _floats(mins), _floats(scales)
    with np.errstate(over="ignore", invalid="ignore"):
        top = mn + np.float32((1 << p["bits"]) - 1) * sc
    if not (np.isfinite(mn).all() and np.isfinite(sc).all() and (sc >= 0).all()
            and np.isfinite(top).all()):
        raise ValueError("group mins/scales are not finite, or a scale is negative, or the "
                         "decoded range overflows float32")
    if len(buffers) == 5:
        idx_buf, vals = buffers[3], buffers[4]
        esize = _dtypes.itemsize(name)
        if idx_buf.nbytes % 8 or vals.nbytes != idx_buf.nbytes // 8 * esize:
            raise ValueError("escape indices and values do not match in count")
        idx = idx_buf.view("<u8")
        if idx.size and (idx[-1] >= count or not (idx[1:] > idx[:-1]).all()):
            raise ValueError("escape indices must be strictly increasing and below the size")


class Quant(Codec):
    name = "quant"
    codec_id = 3
    dtypes = _dtypes.FLOATS
    lossy = True
    decodes_to_float32 = True
    params_struct = PARAMS

    check_params = staticmethod(check_params)

    def params_to_tuple(self, params: dict) -> tuple:
        return params_to_tuple(params)

    def params_from_tuple(self, values: tuple) -> dict:
        return params_from_tuple(values)

    def nbytes(self, count: int, esize: int, params: dict | None) -> int:
        """Packed codes, and a float32 minimum and scale per group."""
        return packed_nbytes(count, params["bits"]) + 8 * ngroups(count, params["group_size"])

    def encode(self, flat, name, params, opts, alloc, work=None, bittrick=-1) -> tuple:
        return quantize_flat(flat, name, params, opts, alloc, bittrick), None

    def validate(self, enc) -> None:
        validate_flat(enc.buffers, enc.size, enc.dtype, enc.params)

    def decode_into(self, enc, buffers, out_bytes, target, opts) -> None:
        dequantize_flat(buffers, prod(enc.shape), enc.dtype, target, enc.params, out_bytes,
                        opts)


def encode(x, bits: int = 8, *, group_size: int | None = 256, rounding: str = "nearest",
           seed: int = 0, nonfinite: str = "raise", dtype: str | None = None,
           threads: int | None = None, simd: str | None = None,
           bittrick: bool | None = None) -> container.Encoded:
    """Quantize a float16/bfloat16/float32/float64 array or tensor to `bits`-bit codes per
    group. bittrick: the code <-> float conversion (None: the path's default; both give the
    same bytes)."""
    return encoder.encode(x, "quant", bits=bits, group_size=group_size, rounding=rounding,
                          seed=seed, nonfinite=nonfinite, dtype=dtype, threads=threads,
                          simd=simd, bittrick=bittrick)


if sys.byteorder != "little":  # pragma: no cover - the format and kernels are little-endian
    raise ImportError("actcodec supports little-endian machines only")
