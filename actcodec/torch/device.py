"""The codecs in plain torch operations, on the tensor's own device (CUDA, MPS, ... or CPU).

The C codecs read CPU memory only. This module produces the same format, byte for byte, with
torch operations on whatever device the tensor lives on, and decodes it there:

    denc = actcodec.torch.device.encode(x_cuda, "quant", bits=4)   # buffers stay on the GPU
    y = actcodec.torch.device.decode(denc)                          # a tensor on the GPU
    denc.to_encoded().to_bytes()                                    # the C path's exact bytes

The quantization math follows csrc/quant.c and csrc/quant_scalar.c operation by operation:
every float op is a separate float32 torch op (no fused multiply-add, no division turned into
a multiplication by a reciprocal: divisors are always device tensors, never Python scalars).
Byte identity therefore rests on the device's float32 add/sub/mul/div being correctly rounded
and keeping subnormals, as IEEE 754 asks: true on CPU (unless torch.set_flush_denormal(True))
and CUDA; not promised on MPS, whose kernels may use fast math.

Non-finite input raises the C path's NonFiniteError, with the same index; nonfinite="keep"
stores such elements in the same escape buffers as the C path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np
import torch

from .. import _dtypes, auto, container, quant

_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}
_NAMES = {v: k for k, v in _TORCH.items()}
_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # same-size views of the bit patterns
_ABS = {2: 0x7FFF, 4: 0x7FFFFFFF, 8: 0x7FFFFFFFFFFFFFFF}
_EXPONENT = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000,
             "float64": 0x7FF0000000000000}
_F32_MAX = float(np.finfo(np.float32).max)

# Elements per step of the elementwise passes, which bounds their temporaries. Powers of two,
# so a step never crosses a 2^32 index boundary and the hash key is constant within it. On the
# CPU, steps whose int64 temporaries stay in cache are several times faster (measured); other
# devices want long steps to amortize kernel launches.
_CPU_CHUNK = 1 << 14
_DEVICE_CHUNK = 1 << 22


def _chunk(device) -> int:
    return _CPU_CHUNK if torch.device(device).type == "cpu" else _DEVICE_CHUNK


# csrc/quant_common.h
_M32 = 0xFFFFFFFF
_HASH_GOLDEN, _HASH_MUL1, _HASH_MUL2, _KEY_OFFSET = 0x9E3779B1, 0x7FEB352D, 0x846CA68B, 0x9E3779B9
_U24_SCALE = 2.0 ** -24

NonFiniteError = quant.NonFiniteError


@dataclass(frozen=True, eq=False)
class DeviceEncoded:
    """An encoding whose payload buffers are uint8 tensors on a device. codec, dtype, shape and
    params are exactly those of `container.Encoded`; `to_encoded()` gives the CPU one."""

    codec: str
    dtype: str
    shape: tuple
    params: dict
    buffers: tuple = field(repr=False)

    @property
    def device(self) -> torch.device:
        return self.buffers[0].device

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers)

    @property
    def original_nbytes(self) -> int:
        return self.size * _dtypes.itemsize(self.dtype)

    @property
    def ratio(self) -> float:
        return self.original_nbytes / self.nbytes if self.nbytes else float("inf")

    def to_encoded(self) -> container.Encoded:
        """A CPU `container.Encoded` holding copies of the buffers."""
        bufs = tuple(b.to("cpu", copy=True).numpy() for b in self.buffers)
        return container.Encoded(self.codec, self.dtype, tuple(self.shape), dict(self.params),
                                 bufs)

    def to_bytes(self) -> bytes:
        return self.to_encoded().to_bytes()

    def decode(self, dtype=None) -> torch.Tensor:
        return decode(self, dtype)

    @classmethod
    def from_encoded(cls, enc: container.Encoded, device=None) -> "DeviceEncoded":
        """Copy a CPU encoding's buffers to `device` (default CPU), after the same checks
        `from_bytes` makes."""
        if not isinstance(enc, container.Encoded):
            raise TypeError(f"from_encoded needs a container.Encoded, got {type(enc).__name__}")
        container.CODECS[enc.codec].validate(enc)
        bufs = tuple(torch.from_numpy(np.array(b, dtype=np.uint8, copy=True)).to(device)
                     for b in enc.buffers)
        return cls(enc.codec, enc.dtype, tuple(enc.shape), dict(enc.params), bufs)


# ---- encoding ----

def encode(t: torch.Tensor, codec: str = "auto", *, bits: int | None = None,
           group_size: int | None = 256, rounding: str = "nearest", seed: int = 0,
           nonfinite: str = "raise", prune: float = 0.0) -> DeviceEncoded:
    """Encode a tensor on its own device; codecs and parameters as `actcodec.encode`."""
    flat, name = _flat_bits(t)
    shape = tuple(int(d) for d in t.shape)
    if codec == "auto":
        nnz = int(torch.count_nonzero(flat))
        codec = auto.smallest(auto.sizes_from_counts(flat.numel(), nnz, flat.element_size(),
                                                     bits, group_size))
    if codec == "raw":
        return DeviceEncoded("raw", name, shape, {}, (_bytes(flat.clone()),))
    if codec == "bitmap":
        thr = _dtypes.prune_abs_bits(prune, name)
        bitmap, values = _bitmap_encode(flat, thr)
        return DeviceEncoded("bitmap", name, shape, {"prune": float(prune)},
                             (bitmap, _bytes(values)))
    if codec in ("quant", "bitmap_quant"):
        if bits is None:
            raise ValueError(f"codec {codec!r} is lossy: pass bits=1, 2, 4 or 8")
        p = quant.check_params(bits, group_size, rounding, nonfinite, seed)
        if codec == "quant":
            bufs = _quantize(flat, name, p)
        else:  # the bitmap, then the nonzero values quantized as a 1-D array
            bitmap, values = _bitmap_encode(flat, 0)
            bufs = [bitmap, *_quantize(values, name, p)]
        return DeviceEncoded(codec, name, shape, p, tuple(bufs))
    raise ValueError(f"unknown codec {codec!r}; choose auto, raw, bitmap, quant or bitmap_quant")


def _flat_bits(t) -> tuple[torch.Tensor, str]:
    """A flat, contiguous integer view of the element bits, and the dtype name."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _NAMES:
        raise TypeError(f"unsupported tensor dtype {t.dtype}; actcodec encodes float16, "
                        f"bfloat16, float32 and float64")
    flat = t.detach().resolve_neg().reshape(-1)  # copies only when not contiguous
    if flat.numel() and flat.stride(0) != 1:  # one element may carry any stride
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(_INT[flat.element_size()]), _NAMES[t.dtype]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a flat tensor as a uint8 tensor (torch cannot view an empty one)."""
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    return t.contiguous().view(torch.uint8)


def _bitmap_encode(flat: torch.Tensor, thr: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(bitmap bytes, nonzero bit patterns). Nonzero is decided on the bits, as in C; with a
    prune threshold, on the magnitude bits (sign masked, so the compare is unsigned-safe)."""
    nz = (flat & _ABS[flat.element_size()]) >= thr if thr else flat != 0
    return _packbits(nz), flat[nz]


def _packbits(mask: torch.Tensor) -> torch.Tensor:
    """np.packbits(mask, bitorder="little") on the mask's device."""
    n = mask.numel()
    nb = (n + 7) // 8
    padded = torch.zeros(nb * 8, dtype=torch.uint8, device=mask.device)
    padded[:n] = mask
    rows = padded.view(nb, 8)
    out = rows[:, 0].clone()
    for i in range(1, 8):
        out |= rows[:, i] << i
    return out


def _unpackbits(bitmap: torch.Tensor, n: int) -> torch.Tensor:
    shifts = torch.arange(8, dtype=torch.uint8, device=bitmap.device)
    return ((bitmap.view(-1, 1) >> shifts) & 1).view(-1)[:n].bool()


def _nonfinite_mask(flat: torch.Tensor, name: str) -> torch.Tensor:
    """NaN/inf (exponent all ones), and float64 beyond the float32 range (quant.py's rule)."""
    exp = _EXPONENT[name]
    mask = (flat & exp) == exp
    if name == "float64":
        mask |= flat.view(torch.float64).abs() > _F32_MAX
    return mask


def _quantize(flat: torch.Tensor, name: str, p: dict) -> list:
    """quant.quantize_flat on the device: [packed, mins, scales] (+ escape indices, values)."""
    escapes = []
    if p["nonfinite"] == "keep":
        mask = _nonfinite_mask(flat, name)
        if bool(mask.any()):
            idx = mask.nonzero().view(-1)  # int64 = uint64 here: indices are non-negative
            escapes = [_bytes(idx), _bytes(flat[idx])]
            flat = flat.masked_fill(mask, 0)
    codes, mins, scales = _quant_codes(flat.view(_TORCH[name]), p)
    return [_pack(codes, p["bits"]), _bytes(mins), _bytes(scales), *escapes]


def _group_size(n: int, group: int | None) -> int:
    return n if not group or group > n else group


def _f32(x, device) -> torch.Tensor:
    """A float32 scalar on the device: a CPU scalar divisor lets CUDA multiply by its
    reciprocal instead of dividing."""
    return torch.full((), x, dtype=torch.float32, device=device)


def _quant_codes(x: torch.Tensor, p: dict):
    """Unpacked codes (uint8), mins and scales (float32) of a flat float tensor, as
    csrc/quant.c computes them."""
    n, dev = x.numel(), x.device
    levels = (1 << p["bits"]) - 1
    codes = torch.empty(n, dtype=torch.uint8, device=dev)
    if n == 0:
        empty = torch.empty(0, dtype=torch.float32, device=dev)
        return codes, empty, empty.clone()
    G = _group_size(n, p["group_size"])
    lo, hi = _group_extrema(x, G)
    # +0.0 makes a zero extreme +0.0 whichever sign it had, as in range_minmax.
    mn, mx = lo + 0.0, hi + 0.0
    scale = (mx - mn) / _f32(levels, dev)
    # A NaN/inf element makes its group's min or max (amin/amax propagate NaN), hence its
    # scale, non-finite; so does a range beyond float32. Either is the C path's error.
    bad = ~torch.isfinite(scale)
    if bool(bad.any()):
        raise NonFiniteError(_first_bad_index(x, int(bad.nonzero()[0]), G))
    inv = torch.where(scale > 0, torch.ones_like(scale) / scale, torch.zeros_like(scale))
    divide = torch.isinf(inv)  # 1/scale overflows: such groups divide by scale instead
    any_divide = bool(divide.any())
    stochastic = p["rounding"] == "stochastic"
    step = _chunk(dev)
    for c0 in range(0, n, step):
        c1 = min(n, c0 + step)
        g = torch.arange(c0, c1, device=dev) // G
        d = x[c0:c1].to(torch.float32) - mn[g]
        t = d * inv[g]
        if any_divide:
            t = torch.where(divide[g], d / scale[g], t)
        t = torch.floor(t + _uniform(p["seed"], c0, c1, dev)) if stochastic else torch.round(t)
        codes[c0:c1] = t.clamp_max_(levels)  # exact small integers: the cast is exact
    return codes, mn, scale


def _group_extrema(x: torch.Tensor, G: int):
    """Per-group min and max as float32. Taken in the input dtype, then converted: conversion
    to float32 is monotone, so it commutes with min and max."""
    n = x.numel()
    full = n // G
    los, his = [], []
    if full:
        rows = x[:full * G].view(full, G)
        los.append(rows.amin(1))
        his.append(rows.amax(1))
    if n % G:
        tail = x[full * G:]
        los.append(tail.amin().view(1))
        his.append(tail.amax().view(1))
    return torch.cat(los).to(torch.float32), torch.cat(his).to(torch.float32)


def _first_bad_index(x: torch.Tensor, g: int, G: int) -> int:
    """The C path's error index for bad group g: its first non-finite element (as float32),
    else the group's first element (its range overflows float32)."""
    start = g * G
    seg = x[start:start + G].to(torch.float32)
    where = (~torch.isfinite(seg)).nonzero()
    return start + (int(where[0]) if where.numel() else 0)


def _mul32(x: torch.Tensor, k: int) -> torch.Tensor:
    """x * k mod 2^32 for int64 x in [0, 2^32), in halves so that no int64 product overflows."""
    return (x * (k & 0xFFFF) + (((x * (k >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(x):
    """ac_mix32 on int64 tensors holding uint32 values, or on a Python int."""
    if isinstance(x, int):
        x ^= x >> 16
        x = x * _HASH_MUL1 & _M32
        x ^= x >> 15
        x = x * _HASH_MUL2 & _M32
        return x ^ (x >> 16)
    x = x ^ (x >> 16)
    x = _mul32(x, _HASH_MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, _HASH_MUL2)
    return x ^ (x >> 16)


def _round_key(seed: int, index_hi: int) -> int:
    return _mix32((seed & _M32) ^ _mix32((seed >> 32) ^ _mix32((index_hi + _KEY_OFFSET) & _M32)))


def _uniform(seed: int, c0: int, c1: int, device) -> torch.Tensor:
    """ac_uniform(seed, i) for i in [c0, c1), a range inside one 2^32-aligned span."""
    if c0 >> 32 != (c1 - 1) >> 32:
        raise ValueError("_uniform: the range crosses a 2^32 index boundary")
    key = _round_key(seed, c0 >> 32)
    lo = torch.arange(c0 & _M32, (c0 & _M32) + (c1 - c0), dtype=torch.int64, device=device)
    bits = _mix32(_mul32(lo, _HASH_GOLDEN) ^ key) >> 8
    return bits.to(torch.float32) * _U24_SCALE  # 24-bit integers times 2^-24: exact


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """The unified layout (docs/FORMAT.md): byte j of a 32-byte block holds codes j + 32 i at
    bit offset bits * i; a short last block keeps min(m, 32) bytes."""
    if bits == 8:
        return codes  # the identity layout
    n, per = codes.numel(), 256 // bits
    nblocks = -(-n // per)
    padded = torch.zeros(nblocks * per, dtype=torch.uint8, device=codes.device)
    padded[:n] = codes
    planes = padded.view(nblocks, 8 // bits, 32)
    out = planes[:, 0].clone()
    for i in range(1, 8 // bits):
        out |= planes[:, i] << (bits * i)
    return out.view(-1)[:quant.packed_nbytes(n, bits)].clone()


def _unpack(packed: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    if bits == 8:
        return packed[:n]
    per = 256 // bits
    nblocks = -(-n // per)
    padded = torch.zeros(nblocks * 32, dtype=torch.uint8, device=packed.device)
    padded[:packed.numel()] = packed
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    codes = (padded.view(nblocks, 1, 32) >> shifts.view(1, -1, 1)) & ((1 << bits) - 1)
    return codes.view(-1)[:n]


# ---- decoding ----

def decode(denc: DeviceEncoded, dtype=None) -> torch.Tensor:
    """Decode into a new tensor on the payload's device, of the encoded dtype or (quantized
    codecs) float32. Agrees bit for bit with `container.Encoded.decode`."""
    if isinstance(denc, container.Encoded):
        raise TypeError("decode needs a DeviceEncoded; wrap a CPU encoding with "
                        "DeviceEncoded.from_encoded(enc, device)")
    if not isinstance(denc, DeviceEncoded):
        raise TypeError(f"decode needs a DeviceEncoded, got {type(denc).__name__}")
    if denc.codec not in container.CODECS:
        raise ValueError(f"unknown codec {denc.codec!r}")
    target = _target_name(denc, dtype)
    bufs = _check_buffers(denc)
    n, es = denc.size, _dtypes.itemsize(denc.dtype)
    out_int = _INT[_dtypes.itemsize(target)]  # bit patterns of the output dtype
    if denc.codec == "raw":
        out = _view(bufs[0].clone(), out_int)
    elif denc.codec == "quant":
        out = _dequantize(bufs, n, denc.dtype, target, denc.params).view(out_int)
    else:  # bitmap codecs: zeros, then the values where the bitmap says
        mask = _unpackbits(bufs[0], n)
        nnz = int(mask.sum())
        if denc.codec == "bitmap":
            if bufs[1].numel() != nnz * es:
                raise ValueError(f"bitmap marks {nnz} nonzero elements but the values buffer "
                                 f"holds {bufs[1].numel() // es}")
            values = _view(bufs[1], _INT[es])
        else:
            values = _dequantize(bufs[1:], nnz, denc.dtype, target, denc.params).view(out_int)
        out = torch.zeros(n, dtype=values.dtype, device=values.device)
        out[mask] = values
    if out.numel() == 0:
        return torch.empty(denc.shape, dtype=_TORCH[target], device=out.device)
    return out.view(_TORCH[target]).reshape(denc.shape)


def _target_name(denc: DeviceEncoded, dtype) -> str:
    if dtype is None:
        target = denc.dtype
    elif isinstance(dtype, torch.dtype):
        if dtype not in _NAMES:
            raise TypeError(f"unsupported dtype {dtype}")
        target = _NAMES[dtype]
    else:
        target = _dtypes.canonical_name(dtype)
    to_f32 = getattr(container.CODECS[denc.codec], "DECODES_TO_FLOAT32", False)
    if target != denc.dtype and not (target == "float32" and to_f32):
        allowed = denc.dtype + (" or float32" if to_f32 else "")
        raise ValueError(f"a {denc.codec} encoding of {denc.dtype} decodes to {allowed}, "
                         f"not {target}")
    return target


def _check_buffers(denc: DeviceEncoded) -> tuple:
    """Buffer types, devices and lengths (cheap checks; `from_encoded` validates fully)."""
    bufs = tuple(denc.buffers)
    if not bufs or not all(isinstance(b, torch.Tensor) and b.dtype == torch.uint8
                           and b.dim() == 1 and b.device == bufs[0].device for b in bufs):
        raise TypeError("DeviceEncoded buffers must be 1-D uint8 tensors on one device")
    n, es = denc.size, _dtypes.itemsize(denc.dtype)
    if denc.codec == "raw":
        if len(bufs) != 1 or bufs[0].numel() != n * es:
            raise ValueError(f"a raw encoding needs one buffer of {n * es} bytes")
    elif denc.codec == "bitmap":
        if len(bufs) != 2 or bufs[0].numel() != (n + 7) // 8:
            raise ValueError(f"a bitmap encoding needs 2 buffers, the first of {(n + 7) // 8} "
                             f"bytes")
    elif denc.codec == "bitmap_quant":
        if len(bufs) not in (4, 6) or bufs[0].numel() != (n + 7) // 8:
            raise ValueError(f"a bitmap_quant encoding needs 4 or 6 buffers, the first of "
                             f"{(n + 7) // 8} bytes")
    elif len(bufs) not in (3, 5):
        raise ValueError(f"a quant encoding needs 3 or 5 buffers, has {len(bufs)}")
    return bufs


def _view(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A typed view of a byte buffer (copied first if its offset does not allow one)."""
    if buf.numel() == 0:
        return torch.empty(0, dtype=dtype, device=buf.device)
    try:
        return buf.view(dtype)
    except RuntimeError:
        return buf.clone().view(dtype)


def _dequantize(bufs, n: int, name: str, out_name: str, p: dict) -> torch.Tensor:
    """quant.dequantize_flat on the device: n elements of out_name, a flat tensor."""
    packed, mins, scales = bufs[:3]
    bits = p["bits"]
    ng = quant.ngroups(n, p["group_size"])
    if packed.numel() != quant.packed_nbytes(n, bits) or mins.numel() != 4 * ng or \
            scales.numel() != 4 * ng:
        raise ValueError(f"packed codes, mins or scales do not match {n} {bits}-bit codes in "
                         f"{ng} groups")
    dev = packed.device
    out = torch.empty(n, dtype=_TORCH[out_name], device=dev)
    if n:
        codes = _unpack(packed, n, bits)
        mn, sc = _view(mins, torch.float32), _view(scales, torch.float32)
        G = _group_size(n, p["group_size"])
        step = _chunk(dev)
        for c0 in range(0, n, step):
            c1 = min(n, c0 + step)
            g = torch.arange(c0, c1, device=dev) // G
            # mins + code * scale: a multiply, then an add, both rounded to float32
            out[c0:c1] = mn[g] + codes[c0:c1].to(torch.float32) * sc[g]
    if len(bufs) == 5:
        es, oes = _dtypes.itemsize(name), _dtypes.itemsize(out_name)
        if bufs[3].numel() % 8 or bufs[4].numel() != bufs[3].numel() // 8 * es:
            raise ValueError("escape indices and values do not match in count")
        idx = _view(bufs[3], torch.int64)
        if idx.numel() and not (0 <= int(idx.min()) and int(idx.max()) < n):
            raise ValueError("escape indices must be below the size")
        out.view(_INT[oes])[idx] = _escape_bits(_view(bufs[4], _INT[es]), name, out_name)
    return out


def _escape_bits(vals: torch.Tensor, name: str, out_name: str) -> torch.Tensor:
    """Escaped bit patterns of `name` as bit patterns of `out_name` (the same, or float32),
    as quant._convert_bits gives them with numpy."""
    if name == out_name:
        return vals
    u = vals.to(torch.int64)
    if name == "bfloat16":
        out = (u & 0xFFFF) << 16
    elif name == "float16":
        # torch's half -> float conversion does not keep NaN payloads on every path; numpy's
        # does, so NaN/inf are converted here on the bits (finite halves convert exactly).
        u &= 0xFFFF
        special = (u & 0x7C00) == 0x7C00
        by_bits = ((u & 0x8000) << 16) | 0x7F800000 | ((u & 0x3FF) << 13)
        cast = vals.view(torch.float16).to(torch.float32).view(torch.int32).to(torch.int64)
        out = torch.where(special, by_bits, cast & _M32)
    else:  # float64: a NaN keeps its sign and top payload bits and becomes quiet (as the CPU)
        is_nan = vals.view(torch.float64).isnan()
        sign = (u < 0).to(torch.int64) << 31
        by_bits = sign | 0x7FC00000 | ((u & 0xFFFFFFFFFFFFF) >> 29)
        cast = vals.view(torch.float64).to(torch.float32).view(torch.int32).to(torch.int64)
        out = torch.where(is_nan, by_bits, cast & _M32)
    # uint32 values into int32 bit patterns without relying on overflowing casts
    return torch.where(out >= 1 << 31, out - (1 << 32), out).to(torch.int32)


# Bit-packing of bool masks on the device (the hooks' and Functions' 1-bit masks).
packbits = _packbits
unpackbits = _unpackbits
