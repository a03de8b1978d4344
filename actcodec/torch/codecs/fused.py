"""Device tensors through the fused Triton kernels (triton_kernels.py) where Triton is, the
torch-op path (device.py) for everything else: the same format, byte for byte, either way.

The kernels cover float32, float16 and bfloat16 tensors of fewer than 2^31 elements: the
quant codec at power-of-two group sizes up to 8192 (one read: extrema, codes, packing and the
codec choice's statistics together), the bitmap codec (one read for the bitmap and the
statistics, one for compaction), bitmap + quant and the mask, and their decoding. What they do
not cover goes to the torch-op path whole: float64, bitmap pruning, other group sizes, and
inputs where a group is bad (a NaN/inf, or a range beyond float32), whose error or escapes
that path produces.

Host syncs: one per encode, the statistics row the codec choice (and the NaN check) needs.
With the quant codec, or "auto" with bits, the quantization runs before that read, in the
same pass as the statistics; where the choice is then a bitmap codec, the bitmap pass
follows. Decoding reads nothing back. `encode_unread` is the quant pass without the read:
its statistics travel to the host behind the kernel (`Unread`), and whoever holds the input
until they arrive learns then whether `encode` would have given the same (the save path's
window, actcodec.torch.save.unsettled, and Packed.settle).
"""
from __future__ import annotations

import functools
import sys

import numpy as np
import torch

from ... import choice, container, encoder, quant
from ...bitmap import nonzero_count
from . import device


@functools.cache
def kernels():
    """The kernels' module, imported on first use (importing Triton takes seconds, which a
    process that never encodes on a GPU should not pay); None without Triton (CPU wheels,
    MPS: the torch-op path serves every device)."""
    try:
        from . import triton_kernels
    except ImportError:
        return None
    return triton_kernels


KIND = {"float32": 0, "float16": 1, "bfloat16": 2}
_EXP = {"float32": 0x7F800000, "float16": 0x7C00, "bfloat16": 0x7F80}
_ABS = {"float32": 0x7FFFFFFF, "float16": 0x7FFF, "bfloat16": 0x7FFF}
_HUGE = {"float32": 0x7E800000, "float16": 0x7C00, "bfloat16": 0x7E80}  # 2^126 (none: f16)
_INT = {2: torch.int16, 4: torch.int32}
GROUP_MAX = 8192  # the largest group a quant tile holds whole
TILE = 2048  # elements per program of the bitmap kernels
# Elements per program of the quant kernels (encode: at least one group). On an H100, encode
# with 1024 and 2 warps took 0.96x a copy's time, with 2048 and 4 warps 1.04x.
QUANT_TILE = 1024
DECODE_TILE = 2048
_LIMIT = 2**31
_ROW_START = -2**31  # every statistics slot's start (triton_kernels._stats_row)


def applies(t: torch.Tensor) -> bool:
    """Whether a tensor's device runs the kernels (CUDA and ROCm devices, with Triton)."""
    return t.device.type == "cuda" and kernels() is not None


def route(t: torch.Tensor):
    """The module whose encode and decode_into serve a non-CPU tensor: this one where the
    kernels run on its device, else the torch-op path."""
    return sys.modules[__name__] if applies(t) else device


def encode(t: torch.Tensor, codec: str = "auto", *, bits: int | None = None,
           group_size: int | None = 256, rounding: str = "nearest", seed: int = 0,
           nonfinite: str = "raise", prune: float = 0.0,
           keep_raw: bool = False) -> container.Encoded | None:
    """device.encode's contract, through the kernels where they cover the input (whatever
    device it is on: tests run them on CPU tensors under Triton's interpreter)."""
    kw = dict(bits=bits, group_size=group_size, rounding=rounding, seed=seed,
              nonfinite=nonfinite, prune=prune, keep_raw=keep_raw)
    p = encoder.check(codec, bits, group_size, rounding, nonfinite, seed, prune)
    if not isinstance(t, torch.Tensor) or kernels() is None or t.dtype not in _TORCH or \
            codec == "raw" or prune or not 0 < t.numel() < _LIMIT:
        return device.encode(t, codec, **kw)
    flat, name = device._flat_bits(t)
    shape = tuple(int(d) for d in t.shape)
    n, es = flat.numel(), flat.element_size()
    group = p["group_size"] if p else None
    if bits is not None and codec in ("auto", "quant") and _tile_holds(n, group):
        bufs, stats = _quantize(flat, name, p)
        counts = _read(stats)
        nnz, one_value, nonfinite_count, huge, bad = counts
        if nonfinite_count or bad:
            return device.encode(t, codec, **kw)  # its error, or its escapes
        codec = _quant_choice(codec, counts, n, es, p)
        if codec == "quant":
            return container.Encoded("quant", name, shape, p, bufs)
        bm, counts = _bitmap(flat, name)[:2]
    else:
        bm, counts, stats = _bitmap(flat, name)
        nnz, one_value, nonfinite_count, huge, _ = _read(stats)
        if codec == "auto":
            codec = choice.smallest(choice.sizes_from_counts(n, nnz, es, bits, group,
                                                             one_value))
        if codec == "quant":  # a group size the quant kernel does not take
            return device.encode(t, codec, **kw)
    if codec == "raw":
        return None if keep_raw else container.Encoded("raw", name, shape, {},
                                                       (device._bytes(flat.clone()),))
    if codec == "mask":
        if nnz and not one_value:
            raise ValueError("not a mask: its nonzero elements differ (use bitmap)")
        value = torch.bitwise_not(stats[:, 1].max()) if nnz else \
            torch.zeros((), dtype=torch.int32, device=flat.device)
        return container.Encoded("mask", name, shape, {},
                                 (bm, device._bytes(value.to(_INT[es]).reshape(1))), nnz)
    values = _compact(flat, counts, nnz)
    if codec == "bitmap":
        return container.Encoded("bitmap", name, shape, {"prune": 0.0},
                                 (bm, device._bytes(values)), nnz)
    # bitmap_quant: a group of the nonzero values is bad only if some element is
    if nonfinite_count or huge or not nnz or not _tile_holds(nnz, group):
        return device.encode(t, codec, **kw)
    qbufs = _quantize(values, name, p)[0]
    return container.Encoded("bitmap_quant", name, shape, p, (bm, *qbufs), nnz)


_TORCH = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _quant_choice(codec: str, counts: tuple, n: int, es: int, p: dict) -> str:
    """The codec `encode` gives once the quant pass's statistics are read (no bad group)."""
    if codec != "auto":
        return codec
    nnz, one_value = counts[:2]
    return choice.smallest(choice.sizes_from_counts(n, nnz, es, p["bits"], p["group_size"],
                                                    one_value))


class Rows:
    """Statistics rows for a run of deferred encodes (one save session's), made many at a
    time: one fill on the device, and on a GPU one block of pinned host memory they are
    copied into, where each encode would otherwise make its own (a device launch and a
    pinned allocation, each costing the host more than the views that replace them). Each
    encode takes the next rows; none is handed out twice (fresh blocks replace used-up
    ones), so rows on their way to the host are never written again."""

    COUNT = 64  # encodes per block: 64 x 3 KiB on the device and in pinned memory

    def __init__(self):
        # device -> [each encode's device rows, its pinned rows (or Nones), next index]
        self._blocks: dict = {}

    def take(self, dev) -> tuple:
        """(rows for one encode on `dev`, the pinned rows to copy them into or None). On a
        GPU a block serves one stream: its fill is queued on the stream the encodes run on,
        and the caching allocator reuses its memory after that stream's work only."""
        key = (dev, torch.cuda.current_stream(dev).cuda_stream) if dev.type == "cuda" else dev
        block = self._blocks.get(key)
        if block is None or block[2] == self.COUNT:
            rows = torch.full((self.COUNT, kernels().SLOTS.value, 6), _ROW_START,
                              dtype=torch.int32, device=dev)
            pinned = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True).unbind(0) \
                if rows.device.type == "cuda" else (None,) * self.COUNT
            block = self._blocks[key] = [rows.unbind(0), pinned, 0]  # views made at once
        rows, pinned, i = block
        block[2] = i + 1
        return rows[i], pinned[i]


class Unread:
    """Statistics rows of a quant pass on their way to the host: on a GPU copied behind the
    kernel into pinned memory (`host`, else allocated here), with an event after the copy,
    so that nothing waits for the device until they are read (CPU tensors, under the
    interpreter: the rows themselves)."""

    __slots__ = ("host", "event", "n", "es", "codec", "params")

    def __init__(self, stats: torch.Tensor, n: int, es: int, codec: str, params: dict,
                 host: torch.Tensor | None = None):
        self.n, self.es, self.codec, self.params = n, es, codec, params
        if stats.device.type == "cuda":
            self.host = host if host is not None else \
                torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
            self.host.copy_(stats, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(stats.device))  # the copy's
        else:
            self.host, self.event = stats, None

    def ready(self) -> bool:
        """Whether reading them now would not wait for the device."""
        return self.event is None or self.event.query()

    def same_as_encode(self) -> bool:
        """Whether `encode` would have returned this quant encoding (waits for the device if
        the statistics have not arrived): no bad group, and "auto" would choose quant."""
        if self.event is not None:
            self.event.synchronize()
        counts = _read(self.host)
        if counts[2] or counts[4]:  # non-finite elements, bad groups: encode's error
            return False
        return _quant_choice(self.codec, counts, self.n, self.es, self.params) == "quant"


def encode_unread(t: torch.Tensor, codec: str = "auto", *, bits: int | None = None,
                  group_size: int | None = 256, rounding: str = "nearest",
                  seed: int = 0,
                  rows: Rows | None = None) -> tuple[container.Encoded, Unread] | None:
    """The quant encoding of t that `encode(t, codec, bits=...)` gives when its input has no
    bad group and ("auto") quant is the smallest codec, without reading anything back, and the
    statistics that say whether it does (`Unread.same_as_encode`); the caller keeps t as it is
    until then, to encode it again where it does not. None where the kernels do not take t
    (encode it with `encode`). rows: where its statistics go (the caller's run of encodes),
    else rows of its own."""
    if bits is None or codec not in ("auto", "quant") or not isinstance(t, torch.Tensor) or \
            kernels() is None or t.dtype not in _TORCH or not 0 < t.numel() < _LIMIT:
        return None
    p = encoder.check(codec, bits, group_size, rounding, "raise", seed, 0.0)
    if t.is_contiguous() and not (t.requires_grad or t.is_neg() or t.is_conj()):
        flat, name = t, _TORCH[t.dtype]  # the kernel reads its bits as they lie
    else:
        flat, name = device._flat_bits(t)
    if not _tile_holds(flat.numel(), p["group_size"]):
        return None
    stats, host = rows.take(flat.device) if rows is not None else (None, None)
    bufs, stats = _quantize(flat, name, p, stats=stats)
    enc = container.Encoded("quant", name, tuple(int(d) for d in t.shape), p, bufs)
    return enc, Unread(stats, flat.numel(), flat.element_size(), codec, p, host)


def _tile_holds(n: int, group: int | None) -> bool:
    """Whether the quant kernel takes n elements in groups of `group`: a power of two up to
    GROUP_MAX, or one group (None, or at least n) of up to GROUP_MAX elements."""
    g = n if not group or group >= n else group
    return g <= GROUP_MAX and (group is None or group >= n or group & (group - 1) == 0)


def _launch(kernel, programs: int, *args, **constants):
    """Launch on the first argument's device (Triton launches on the current device's
    stream, which a model spread over GPUs need not have made that one)."""
    dev = args[0].device
    if dev.type == "cuda" and dev.index is not None and dev.index != torch.cuda.current_device():
        with torch.cuda.device(dev):
            kernel[(programs,)](*args, **constants, enable_fp_fusion=False)
        return
    kernel[(programs,)](*args, **constants, enable_fp_fusion=False)


def _stats(dev) -> torch.Tensor:
    """Statistics rows the kernels fold into (see triton_kernels._stats_row), made on the
    device in one fill (a tensor built from host values would wait for the stream first)."""
    return torch.full((kernels().SLOTS.value, 6), _ROW_START, dtype=torch.int32, device=dev)


def _read(stats: torch.Tensor) -> tuple:
    """The statistics rows, read (one host sync for device rows) and summed up: nonzero
    count, whether the nonzero elements are one bit pattern, non-finite elements, huge
    elements, bad groups."""
    rows = (stats if stats.device.type == "cpu" else stats.cpu()).numpy()
    # in int64: each row's count is its value + 2^31 (it started at _ROW_START)
    sums = rows.sum(axis=0, dtype=np.int64) - len(rows) * _ROW_START
    nnz, nonfinite, huge, bad = (int(sums[k]) for k in (0, 3, 4, 5))
    lo, hi = ~int(rows[:, 1].max()), int(rows[:, 2].max())
    return nnz, nnz > 0 and lo == hi, nonfinite, huge, bad


def _quantize(flat: torch.Tensor, name: str, p: dict, tile: int | None = None,
              warps: int | None = None, stats: torch.Tensor | None = None):
    """[packed, mins, scales] of flat's elements, and their statistics rows (`stats`, fresh
    ones from `_stats` where not given). tile, warps: the elements per program (a power of
    two holding whole groups; the bytes do not depend on it) and its warps, where not the
    defaults (bench/gpu.py compares them)."""
    n, dev, bits = flat.numel(), flat.device, p["bits"]
    group = p["group_size"]
    G = n if not group or group >= n else group
    G = 1 << max(5, (G - 1).bit_length())  # one group of n pads to a power of two
    tile = tile or QUANT_TILE
    if tile < 256 or tile & (tile - 1):
        raise ValueError(f"a quant tile is a power of two of at least 256, got {tile}")
    tile = max(G, tile)
    programs = -(-n // tile)
    ngroups = quant.ngroups(n, group)
    nbytes = quant.packed_nbytes(n, bits)
    # One allocation for the three buffers (a device allocation costs its host more than a
    # view): the codes, then the mins and the scales, each from a multiple of 16 bytes.
    mins_at = -(-nbytes // 16) * 16
    scales_at = mins_at + -(-4 * ngroups // 16) * 16
    out = torch.empty(scales_at + 4 * ngroups, dtype=torch.uint8, device=dev)
    stats = stats if stats is not None else _stats(dev)
    stochastic = p["rounding"] == "stochastic"
    key = device._round_key(p["seed"], 0) if stochastic else 0
    _launch(kernels().quant_encode, programs, flat, out, stats, n, nbytes, ngroups, key,
            mins_at, scales_at, G=G, TILE=tile, BITS=bits, STOCHASTIC=stochastic, KIND=KIND[name],
            EXP=_EXP[name], HUGE=_HUGE[name], ABS=_ABS[name],
            num_warps=warps or (2 if tile <= 1024 else 4))
    return [out[:nbytes], out[mins_at:mins_at + 4 * ngroups], out[scales_at:]], stats


def _bitmap(flat: torch.Tensor, name: str):
    """The bitmap, each tile's nonzero count, and the statistics rows."""
    n, dev = flat.numel(), flat.device
    programs = -(-n // TILE)
    bm = torch.empty((n + 7) // 8, dtype=torch.uint8, device=dev)
    counts = torch.empty(programs, dtype=torch.int32, device=dev)
    stats = _stats(dev)
    _launch(kernels().bitmap_encode, programs, flat, bm, counts, stats, n, TILE=TILE,
            EXP=_EXP[name], HUGE=_HUGE[name], ABS=_ABS[name])
    return bm, counts, stats


def _offsets(counts: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sums of per-tile counts: where each tile's values start."""
    c = counts.to(torch.int64)
    return torch.cumsum(c, 0) - c


def _compact(flat: torch.Tensor, counts: torch.Tensor, nnz: int) -> torch.Tensor:
    out = torch.empty(nnz, dtype=flat.dtype, device=flat.device)
    if nnz:
        _launch(kernels().compact, counts.numel(), flat, _offsets(counts), out, flat.numel(),
                TILE=TILE)
    return out


# ---- decoding ----

def decode_into(enc: container.Encoded, out: torch.Tensor, target: str) -> None:
    """device.decode_into's contract, through the kernels where they cover the encoding."""
    bufs = device._check_buffers(enc)
    n = enc.size
    if kernels() is None or enc.codec not in ("quant", "bitmap", "bitmap_quant") or \
            enc.dtype not in KIND or target not in KIND or not 0 < n < _LIMIT or \
            len(bufs) not in (2, 3, 4) or (enc.codec == "bitmap" and target != enc.dtype):
        device.decode_into(enc, out, target)
        return
    if enc.codec == "quant":
        if not out.is_contiguous():
            raise ValueError("decode_into needs a contiguous output tensor")
        _dequantize(bufs, n, target, enc.params, out)
        return
    flat_out = out.view(-1)
    nnz = nonzero_count(enc, bufs[0])
    es = torch.empty(0, dtype=out.dtype).element_size()
    if enc.codec == "bitmap":
        if bufs[1].numel() != nnz * es:
            raise ValueError(f"bitmap marks {nnz} nonzero elements but the values buffer "
                             f"holds {bufs[1].numel() // es}")
        values = device._view(bufs[1], _INT[es])
    else:
        values = torch.empty(nnz, dtype=out.dtype, device=out.device)
        if nnz:
            _dequantize(bufs[1:], nnz, target, enc.params, values)
        values = values.view(_INT[es])
    programs = -(-n // TILE)
    counts = torch.empty(programs, dtype=torch.int64, device=out.device)
    _launch(kernels().bitmap_counts, programs, bufs[0], counts, n, TILE=TILE)
    _launch(kernels().expand, programs, bufs[0], _offsets(counts), values,
            flat_out.view(_INT[es]), n, TILE=TILE)


def _dequantize(bufs, n: int, target: str, p: dict, out: torch.Tensor,
                tile: int = DECODE_TILE, warps: int | None = None) -> None:
    packed, mins, scales = bufs[:3]
    bits = p["bits"]
    ngroups = quant.ngroups(n, p["group_size"])
    nbytes = quant.packed_nbytes(n, bits)
    if packed.numel() != nbytes or mins.numel() != 4 * ngroups or \
            scales.numel() != 4 * ngroups:
        raise ValueError(f"packed codes, mins or scales do not match {n} {bits}-bit codes in "
                         f"{ngroups} groups")
    G = n if not p["group_size"] or p["group_size"] > n else p["group_size"]
    if tile < 256 or tile & (tile - 1):
        raise ValueError(f"a decode tile is a power of two of at least 256, got {tile}")
    _launch(kernels().quant_decode, -(-n // tile), packed, _aligned(mins), _aligned(scales),
            out, n, nbytes, G, TILE=tile, BITS=bits, OUT=KIND[target],
            **({"num_warps": warps} if warps else {}))


def _aligned(buf: torch.Tensor) -> torch.Tensor:
    """A byte buffer the kernels read as float32: itself where 4-byte aligned, else a copy."""
    return buf if buf.data_ptr() % 4 == 0 else buf.clone()
