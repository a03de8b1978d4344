"""The codecs in plain torch operations, on the tensor's own device (CUDA, MPS, ... or CPU).

The C codecs read host memory only. This module writes the same format, byte for byte, with
torch operations on whatever device a tensor lives on, and decodes it there. `actcodec.encode`
sends tensors on other devices here; `encode` below also takes CPU tensors, which is how the
tests hold this path to the C one byte for byte.

    enc = actcodec.encode(x_cuda, bits=4)      # buffers stay on the GPU
    y = enc.decode()                            # a tensor on the GPU
    enc.to_bytes()                              # the C path's exact bytes

Host syncs: one per encode, where the counts the codec choice needs (nonzero elements,
whether they are one value, non-finite and huge elements) cross to the host together; none
inside bitmap or quant, none for a bool tensor's mask (a dropout's: its size and its one value
are known), and none in decode for a mask or an encoding that knows its nonzero count.

The quantization math follows csrc/quant.c and csrc/quant_scalar.c operation by operation:
every float op is a separate float32 torch op (no fused multiply-add, no division turned into
a multiplication by a reciprocal: divisors are device tensors, never Python scalars). Byte
identity therefore rests on the device's float32 add/sub/mul/div being correctly rounded and
keeping subnormals, as IEEE 754 asks: true on CPU (unless torch.set_flush_denormal(True)) and
CUDA; not promised on MPS, whose kernels may use fast math.
"""
from __future__ import annotations

import torch

from ... import _dtypes, choice, container, encoder, quant
from ...bitmap import nonzero_count
from ...quant import (EXPONENT, F32_MAX, HASH_GOLDEN, HASH_KEY_OFFSET, HASH_MUL1, HASH_MUL2,
                     U24_SCALE)
from ...registry import CODECS
from .dtypes import NAMES, TORCH_DTYPES

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # bit-pattern views
_ABS = {2: 0x7FFF, 4: 0x7FFFFFFF, 8: 0x7FFFFFFFFFFFFFFF}
# Below this magnitude no group's float32 range (max - min) can overflow.
_HUGE = 2.0 ** 126

# Elements per step of the elementwise passes, which bounds their temporaries. Powers of two,
# so a step never crosses a 2^32 index boundary and the hash key is constant within it. On the
# CPU, steps whose int64 temporaries stay in cache are several times faster (measured); other
# devices want long steps to amortize kernel launches.
_CPU_CHUNK = 1 << 14
_DEVICE_CHUNK = 1 << 22

_M32 = 0xFFFFFFFF

NonFiniteError = quant.NonFiniteError


def _chunk(device) -> int:
    return _CPU_CHUNK if torch.device(device).type == "cpu" else _DEVICE_CHUNK


# ---- encoding ----

def encode(t: torch.Tensor, codec: str = "auto", *, bits: int | None = None,
           group_size: int | None = 256, rounding: str = "nearest", seed: int = 0,
           nonfinite: str = "raise", prune: float = 0.0,
           keep_raw: bool = False) -> container.Encoded | None:
    """Encode a tensor with torch ops on its own device; codecs and parameters as
    `actcodec.encode`. Returns None for a raw choice when keep_raw."""
    p = encoder.check(codec, bits, group_size, rounding, nonfinite, seed, prune)
    flat, name = _flat_bits(t)
    shape = tuple(int(d) for d in t.shape)
    n, es = flat.numel(), flat.element_size()
    if name == "bool" and codec in ("auto", "mask"):
        # every nonzero element is True: the mask needs no count, and none is read (its
        # nnz is counted from the bitmap if ever asked for)
        return container.Encoded("mask", name, shape, {}, (
            _packbits(flat), torch.ones(1, dtype=torch.uint8, device=flat.device)))
    survey = None
    if codec != "raw":
        survey = _survey(flat, name, nonfinite)
    if codec == "auto":
        if name == "bool":
            codec = "mask"
        else:
            codec = choice.smallest(choice.sizes_from_counts(
                n, survey["nnz"], es, bits, group_size, survey["one_value"]))
    _dtypes.require(name, CODECS[codec].dtypes, codec)
    if codec == "raw":
        if keep_raw:
            return None
        return container.Encoded("raw", name, shape, {}, (_bytes(flat.clone()),))
    nnz = survey["nnz"]
    if codec == "bitmap" and prune:
        thr = _dtypes.prune_abs_bits(prune, name)
        keep = (flat & _ABS[es]) >= thr
        nnz = int(keep.sum())  # pruning changes the count: the one read of this call
        bm, values = _packbits(keep), _compact(flat, keep, nnz)
        return container.Encoded("bitmap", name, shape, {"prune": float(prune)},
                                 (bm, _bytes(values)), nnz)
    nz = flat != 0
    bm = _packbits(nz)
    if codec == "bitmap":
        return container.Encoded("bitmap", name, shape, {"prune": 0.0},
                                 (bm, _bytes(_compact(flat, nz, nnz))), nnz)
    if codec == "mask":
        if nnz and not survey["one_value"]:
            raise ValueError("not a mask: its nonzero elements differ (use bitmap)")
        value = torch.ones(1, dtype=torch.uint8, device=flat.device) if name == "bool" else \
            _bytes(flat[_first_nonzero(nz)].reshape(1) * (nnz > 0))
        return container.Encoded("mask", name, shape, {}, (bm, value), nnz)
    if codec == "quant":
        return container.Encoded("quant", name, shape, p,
                                 tuple(_quantize(flat, name, p, survey)))
    values = _compact(flat, nz, nnz)
    qbufs = _quantize(values, name, p, survey)
    return container.Encoded("bitmap_quant", name, shape, p, (bm, *qbufs), nnz)


def _flat_bits(t) -> tuple[torch.Tensor, str]:
    """A flat, contiguous integer view of the element bits, and the dtype name."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in NAMES:
        raise TypeError(f"unsupported tensor dtype {t.dtype}; actcodec encodes float16, "
                        f"bfloat16, float32, float64 and (raw, mask) bool")
    flat = t.detach() if t.requires_grad else t
    if flat.is_neg():
        flat = flat.resolve_neg()
    if flat.is_conj():
        flat = flat.resolve_conj()
    flat = flat.reshape(-1)  # copies only if strided
    if flat.numel() and flat.stride(0) != 1:  # one element may carry any stride
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(_INT[flat.element_size()]), NAMES[t.dtype]


def _survey(flat: torch.Tensor, name: str, nonfinite: str = "raise") -> dict:
    """Everything the choice and the codecs need from the host, in one read, from a few
    reductions rather than elementwise masks: the nonzero count, whether the nonzero elements
    are one bit pattern, and (floats) whether quantization must look for bad groups: some
    element is non-finite, or large enough for a group's range to overflow. Under
    nonfinite="keep" it counts the non-finite elements instead."""
    if flat.numel() == 0:
        return {"nnz": 0, "one_value": False, "bad": 0, "huge": False}
    nnz = torch.count_nonzero(flat)
    counts = [nnz, _one_value(flat, nnz)]
    if name != "bool":
        if nonfinite == "keep":
            bad = _nonfinite_mask(flat, name)
            huge = (flat.view(TORCH_DTYPES[name]).abs() >= _HUGE) & ~bad
            counts += [bad.sum(), huge.any()]
        else:
            # NaN propagates through min and max, so the extremes see every bad element.
            lo, hi = torch.aminmax(flat.view(TORCH_DTYPES[name]))
            mag = torch.maximum(lo.abs(), hi.abs()).to(torch.float64)
            limit = F32_MAX if name == "float64" else float("inf")
            bad = ~(mag < limit) | mag.isnan()
            counts += [bad, ~(mag < _HUGE)]
    got = torch.stack([c.to(torch.int64) for c in counts]).tolist()
    out = {"nnz": got[0], "one_value": bool(got[1])}
    if name != "bool":
        out.update(bad=got[2], huge=bool(got[3]))
    return out


def _one_value(flat: torch.Tensor, nnz: torch.Tensor) -> torch.Tensor:
    """Whether the nonzero bit patterns are all one (a device bool). With the extremes of the
    patterns: either they are equal, or one of them is zero and the other times the count of
    nonzero elements is their sum (every other term lies between zero and it)."""
    if flat.element_size() > 4:  # the sum of 64-bit patterns could overflow
        first = flat[_first_nonzero(flat != 0)]
        return ((flat == first) | (flat == 0)).all() & (nnz > 0)
    lo, hi = (v.to(torch.int64) for v in torch.aminmax(flat))
    total = flat.sum(dtype=torch.int64)
    return (nnz > 0) & ((lo == hi) | ((lo == 0) & (total == nnz * hi))
                        | ((hi == 0) & (total == nnz * lo)))


def _first_nonzero(nz: torch.Tensor) -> torch.Tensor:
    """Index of the first True (0 if none), on the device."""
    return nz.to(torch.uint8).argmax()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a flat tensor as a uint8 tensor (torch cannot view an empty one)."""
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    return t.contiguous().view(torch.uint8)


def _compact(flat: torch.Tensor, keep: torch.Tensor, count: int) -> torch.Tensor:
    """flat[keep] with the count known: no host sync (boolean indexing would need one)."""
    return flat[torch.nonzero_static(keep, size=count).view(-1)]


def _packbits(mask: torch.Tensor) -> torch.Tensor:
    """np.packbits(mask, bitorder="little") on the mask's device."""
    n = mask.numel()
    nb = (n + 7) // 8
    if n % 8:
        padded = torch.zeros(nb * 8, dtype=torch.uint8, device=mask.device)
        padded[:n] = mask.reshape(-1)
    else:
        padded = mask.reshape(-1).view(torch.uint8)
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device)
    # distinct powers of two: their sum is their OR and fits a byte
    return (padded.view(nb, 8) << shifts).sum(1, dtype=torch.uint8)


def _unpackbits(bitmap: torch.Tensor, n: int) -> torch.Tensor:
    shifts = torch.arange(8, dtype=torch.uint8, device=bitmap.device)
    return ((bitmap.view(-1, 1) >> shifts) & 1).view(-1)[:n].bool()


def _nonfinite_mask(flat: torch.Tensor, name: str) -> torch.Tensor:
    """NaN/inf (exponent all ones), and float64 beyond the float32 range (quant.py's rule)."""
    exp = EXPONENT[name]
    mask = (flat & exp) == exp
    if name == "float64":
        mask |= flat.view(torch.float64).abs() > F32_MAX
    return mask


def _quantize(flat: torch.Tensor, name: str, p: dict, survey: dict) -> list:
    """quant.quantize_flat on the device: [packed, mins, scales] (+ escape indices, values)."""
    escapes = []
    if survey["bad"] and p["nonfinite"] == "keep":
        mask = _nonfinite_mask(flat, name)
        idx = torch.nonzero_static(mask, size=survey["bad"]).view(-1)
        escapes = [_bytes(idx), _bytes(flat[idx])]
        flat = flat.masked_fill(mask, 0)
    # Only where the survey saw a non-finite (still there) or huge element can a group be
    # bad: then, and only then, the scales are checked on the host.
    check = survey["huge"] or (survey["bad"] > 0 and p["nonfinite"] == "raise")
    codes, mins, scales = _quant_codes(flat.view(TORCH_DTYPES[name]), p, check)
    return [_pack(codes, p["bits"]), _bytes(mins), _bytes(scales), *escapes]


def _group_size(n: int, group: int | None) -> int:
    return n if not group or group > n else group


def _f32(x, device) -> torch.Tensor:
    """A float32 scalar on the device: a CPU scalar divisor lets CUDA multiply by its
    reciprocal instead of dividing."""
    return torch.full((), x, dtype=torch.float32, device=device)


def _quant_codes(x: torch.Tensor, p: dict, check: bool):
    """Unpacked codes (uint8), mins and scales (float32) of a flat float tensor, as
    csrc/quant.c computes them. check: some group may be bad (a NaN/inf, or a range beyond
    float32), so look, and raise the C path's error."""
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
    if check:  # NaN/inf make their group's scale NaN, and so does a range beyond float32
        bad = ~torch.isfinite(scale)
        if bool(bad.any()):
            raise NonFiniteError(_first_bad_index(x, int(bad.nonzero()[0]), G))
    inv = torch.where(scale > 0, torch.ones_like(scale) / scale, torch.zeros_like(scale))
    # Where 1/scale overflows, a group divides by its scale instead. Each group either
    # divides by its scale and multiplies by one, or divides by one and multiplies by its
    # inverse: both of the extra operations are exact, so no per-element select is needed.
    divide = torch.isinf(inv)
    one = torch.ones_like(scale)
    divisor, factor = torch.where(divide, scale, one), torch.where(divide, one, inv)
    stochastic = p["rounding"] == "stochastic"
    for c0, c1, g0, g1 in _spans(n, G, _chunk(dev)):
        rows = x[c0:c1].view(g1 - g0, -1).to(torch.float32)
        t = (rows - mn[g0:g1, None]) / divisor[g0:g1, None] * factor[g0:g1, None]
        if stochastic:
            t = torch.floor(t + _uniform_span(p["seed"], c0, c1, dev).view_as(t))
        else:
            t = torch.round(t)
        codes[c0:c1] = t.clamp_max_(levels).view(-1)  # exact small integers: an exact cast
    return codes, mn, scale


def _spans(n: int, G: int, step: int):
    """(first element, end element, first group, end group) of consecutive runs of whole
    groups of about `step` elements, the short last group in a run of its own."""
    full = n // G
    per = max(1, step // G)
    for g0 in range(0, full, per):
        g1 = min(full, g0 + per)
        yield g0 * G, g1 * G, g0, g1
    if n % G:
        yield full * G, n, full, full + 1


def _group_extrema(x: torch.Tensor, G: int):
    """Per-group min and max as float32. Taken in the input dtype, then converted: conversion
    to float32 is monotone, so it commutes with min and max."""
    n = x.numel()
    full = n // G
    los, his = [], []
    if full:
        lo, hi = torch.aminmax(x[:full * G].view(full, G), dim=1)
        los.append(lo)
        his.append(hi)
    if n % G:
        lo, hi = torch.aminmax(x[full * G:])
        los.append(lo.view(1))
        his.append(hi.view(1))
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
        x = x * HASH_MUL1 & _M32
        x ^= x >> 15
        x = x * HASH_MUL2 & _M32
        return x ^ (x >> 16)
    x = x ^ (x >> 16)
    x = _mul32(x, HASH_MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, HASH_MUL2)
    return x ^ (x >> 16)


def _round_key(seed: int, index_hi: int) -> int:
    return _mix32((seed & _M32) ^ _mix32((seed >> 32) ^ _mix32((index_hi + HASH_KEY_OFFSET) & _M32)))


def _uniform(seed: int, c0: int, c1: int, device) -> torch.Tensor:
    """ac_uniform(seed, i) for i in [c0, c1), a range inside one 2^32-aligned span."""
    if c0 >> 32 != (c1 - 1) >> 32:
        raise ValueError("_uniform: the range crosses a 2^32 index boundary")
    key = _round_key(seed, c0 >> 32)
    lo = torch.arange(c0 & _M32, (c0 & _M32) + (c1 - c0), dtype=torch.int64, device=device)
    bits = _mix32(_mul32(lo, HASH_GOLDEN) ^ key) >> 8
    return bits.to(torch.float32) * U24_SCALE  # 24-bit integers times 2^-24: exact


def _uniform_span(seed: int, c0: int, c1: int, device) -> torch.Tensor:
    """ac_uniform(seed, i) for i in [c0, c1), split where the hash key changes."""
    parts, a = [], c0
    while a < c1:
        b = min(c1, ((a >> 32) + 1) << 32)
        parts.append(_uniform(seed, a, b, device))
        a = b
    return parts[0] if len(parts) == 1 else torch.cat(parts)


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

def decode_into(enc: container.Encoded, out: torch.Tensor, target: str) -> None:
    """Decode a torch-buffered encoding into `out`, a contiguous tensor of the target dtype
    on the buffers' device (actcodec.torch.backend.decode checks it). Agrees bit for bit with
    the C path."""
    bufs = _check_buffers(enc)
    n, es = enc.size, _dtypes.itemsize(enc.dtype)
    flat_out = out.view(-1).view(_INT[_dtypes.itemsize(target)])
    if n == 0:
        return
    if enc.codec == "raw":
        flat_out.copy_(_view(bufs[0], flat_out.dtype))
        return
    if enc.codec == "quant":
        flat_out.copy_(_dequantize(bufs, n, enc.dtype, target, enc.params).view(flat_out.dtype))
        return
    mask = _unpackbits(bufs[0], n)
    if enc.codec == "mask":  # its count is not needed (and may not be known)
        value = _view(bufs[1], flat_out.dtype)
        flat_out.copy_(torch.where(mask, value, torch.zeros_like(value)))
        return
    nnz = nonzero_count(enc, bufs[0])
    if enc.codec == "bitmap":
        if bufs[1].numel() != nnz * es:
            raise ValueError(f"bitmap marks {nnz} nonzero elements but the values buffer "
                             f"holds {bufs[1].numel() // es}")
        values = _view(bufs[1], _INT[es])
    else:
        values = _dequantize(bufs[1:], nnz, enc.dtype, target, enc.params).view(flat_out.dtype)
    if nnz == 0:
        flat_out.zero_()
        return
    flat_out.zero_()
    flat_out[torch.nonzero_static(mask, size=nnz).view(-1)] = values  # no host sync


def _check_buffers(enc: container.Encoded) -> tuple:
    """Buffer types, devices and lengths (cheap checks; container.validate checks fully)."""
    bufs = tuple(enc.buffers)
    if not bufs or not all(isinstance(b, torch.Tensor) and b.dtype == torch.uint8
                           and b.dim() == 1 and b.device == bufs[0].device for b in bufs):
        raise TypeError("an encoding's tensor buffers must be 1-D uint8 tensors on one device")
    n, es = enc.size, _dtypes.itemsize(enc.dtype)
    nb = (n + 7) // 8
    counts = {"raw": (1,), "bitmap": (2,), "mask": (2,), "quant": (3, 5),
              "bitmap_quant": (4, 6)}[enc.codec]
    if len(bufs) not in counts:
        raise ValueError(f"a {enc.codec} encoding needs {' or '.join(map(str, counts))} "
                         f"buffers, has {len(bufs)}")
    if enc.codec == "raw" and bufs[0].numel() != n * es:
        raise ValueError(f"a raw encoding needs one buffer of {n * es} bytes")
    if enc.codec in ("bitmap", "mask", "bitmap_quant") and bufs[0].numel() != nb:
        raise ValueError(f"a {enc.codec} encoding's bitmap has {nb} bytes, not "
                         f"{bufs[0].numel()}")
    if enc.codec == "mask" and bufs[1].numel() != es:
        raise ValueError(f"a mask's value is one element ({es} bytes)")
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
    out = torch.empty(n, dtype=TORCH_DTYPES[out_name], device=dev)
    if n:
        codes = _unpack(packed, n, bits)
        mn, sc = _view(mins, torch.float32), _view(scales, torch.float32)
        G = _group_size(n, p["group_size"])
        for c0, c1, g0, g1 in _spans(n, G, _chunk(dev)):
            rows = codes[c0:c1].view(g1 - g0, -1).to(torch.float32)
            # mins + code * scale: a multiply, then an add, both rounded to float32
            out[c0:c1] = (rows * sc[g0:g1, None] + mn[g0:g1, None]).view(-1)
    if len(bufs) == 5:
        es, oes = _dtypes.itemsize(name), _dtypes.itemsize(out_name)
        if bufs[3].numel() % 8 or bufs[4].numel() != bufs[3].numel() // 8 * es:
            raise ValueError("escape indices and values do not match in count")
        idx = _view(bufs[3], torch.int64)
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
