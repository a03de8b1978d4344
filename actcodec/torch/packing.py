"""One compressed tensor as autograd keeps it: payload buffers as uint8 tensors plus the small
metadata needed to restore it. Shared by the saved-tensor hooks and the autograd Functions.

Kinds:
- "encoded": an actcodec encoding (raw, bitmap, quant, bitmap_quant) of a float tensor;
- "mask": a tensor whose nonzero elements all have one bit pattern (0/1 masks, CPU dropout's
  scaled masks, bool tensors): a bitmap plus that one value, exact at 1 bit per element;
- "device": the same encoding made with torch ops on a non-CPU tensor's own device
  (actcodec.torch.device), its payload staying on that device;
- "narrow": an integer tensor stored in the smallest integer type that holds its values
  (max-pool indices: int64 positions within a plane fit int16), exact;
- "kept": the tensor itself, uncompressed (the policy said so, or nothing smaller exists).

The payload tensors share memory with the codec's output buffers (no copy), so a Function can
hand them to `ctx.save_for_backward` and rebuild the Packed in backward with `Packed.restore`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import _ext, auto, bitmap, bitmap_quant, container, quant
from . import bridge, device

# Codec threads inside training: by default as many as torch uses for its ops. On Linux both
# run on one OpenMP runtime (the extension links libgomp.so.1 by soname, the name torch's
# bundled copy carries, so the process loads one), so a codec call reuses the team torch's
# ops just used; under two runtimes (torch on libiomp5) the pools would compete, and
# set_codec_threads(1) is the way out. Measured on a ResNet-18 2-bit step here, 25
# interleaved rounds: 1.11x the fp32 step with 2 codec threads, 1.17x with 1 (medians of
# per-round ratios).
# set_codec_threads(n) fixes the count; None returns to following torch.
_CODEC_THREADS: list = [None]


def set_codec_threads(n: int | None) -> None:
    """Threads the torch adapters give each codec call (None: torch.get_num_threads())."""
    if n is not None and n < 1:
        raise ValueError(f"codec threads must be >= 1 or None, got {n}")
    _CODEC_THREADS[0] = n


class _threads:
    """Run a block with the adapters' codec thread count, then restore the library's."""

    def __enter__(self):
        self.saved = _ext.get_num_threads()
        n = _CODEC_THREADS[0]
        _ext.set_num_threads(n if n is not None else max(1, torch.get_num_threads()))

    def __exit__(self, *exc):
        _ext.set_num_threads(self.saved)


FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NP_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class Setting:
    """How to store one tensor. codec: "auto" (the smallest that `bits` allows), "raw",
    "bitmap", "quant", "bitmap_quant", or "keep" (store it uncompressed). bits=None: lossless."""

    codec: str = "auto"
    bits: int | None = 8
    group_size: int | None = 256
    rounding: str = "nearest"
    seed: int = 0

    def __post_init__(self):
        if self.codec not in ("auto", "raw", "bitmap", "quant", "bitmap_quant", "keep"):
            raise ValueError(f"unknown codec {self.codec!r}; choose auto, raw, bitmap, quant, "
                             f"bitmap_quant or keep")
        if self.bits is not None or self.codec in ("quant", "bitmap_quant"):
            quant.check_params(self.bits, self.group_size, self.rounding, "raise",
                               self.seed % 2**64)


LOSSLESS = Setting(bits=None)
KEEP = Setting(codec="keep", bits=None)


@dataclass(frozen=True)
class Meta:
    """Everything about a Packed except its payload tensors."""

    kind: str
    codec: str              # the codec used, or "mask" / "keep"
    dtype: torch.dtype      # the original tensor's dtype
    shape: tuple
    params: dict | None = None
    encoded_dtype: str | None = None
    buffer_dtypes: tuple = ()
    original_nbytes: int = 0


class Packed:
    """A compressed tensor: `meta` plus `payload` (uint8 tensors, or the kept tensor)."""

    __slots__ = ("meta", "payload", "on_decode", "uses", "_pending", "_decoded", "_arrays",
                 "__weakref__")

    def __init__(self, meta: Meta, payload: tuple, on_decode=None, arrays=None):
        self.meta, self.payload, self.on_decode = meta, tuple(payload), on_decode
        # The codec's numpy buffers the payload tensors share memory with, when pack made
        # them (a Packed rebuilt from saved tensors converts back). Whatever moves or
        # replaces a payload must build a new Packed, or these would point at the old memory.
        self._arrays = arrays
        # Saves that hold this Packed (the hooks count a tensor several ops save), and how
        # many of them the current backward has still to unpack: the decoded tensor is kept
        # for those, so a ReLU output that the ReLU and the next convolution both saved is
        # decoded once per backward, and dropped with its last use. (A backward that skips
        # some of the uses, torch.autograd.grad on part of a graph, leaves the copy held
        # until the next unpack or until the graph is freed: memory, never wrong values.)
        self.uses, self._pending, self._decoded = 1, 0, None

    @property
    def codec(self) -> str:
        return self.meta.codec

    @property
    def nbytes(self) -> int:
        """Exact bytes held: the payload tensors' sizes."""
        return sum(t.numel() * t.element_size() for t in self.payload)

    @classmethod
    def restore(cls, meta: Meta, payload, on_decode=None) -> "Packed":
        return cls(meta, payload, on_decode)

    def unpack(self) -> torch.Tensor:
        if self._pending <= 0:  # the first use in this backward
            self._pending = self.uses
        self._pending -= 1
        out = self._decoded
        if out is None:
            t0 = time.perf_counter()
            with _threads():
                out = self._unpack()
            if self.on_decode is not None:
                self.on_decode(time.perf_counter() - t0)
        self._decoded = out if self._pending > 0 else None
        return out

    def _unpack(self) -> torch.Tensor:
        m = self.meta
        if m.kind == "kept":
            return self.payload[0]
        if m.kind == "mask":
            return _unpack_mask(m, self.payload)
        if m.kind == "narrow":
            return self.payload[0].to(m.dtype)
        if m.kind == "device":
            enc = device.DeviceEncoded(m.codec, m.encoded_dtype, m.shape, m.params,
                                       self.payload)
            out = device.decode(enc)
            return out if out.dtype == m.dtype else out.to(m.dtype)
        bufs = self._arrays
        if bufs is None:
            bufs = tuple(p.numpy().view(dt) for p, dt in zip(self.payload, m.buffer_dtypes))
        enc = container.Encoded(m.codec, m.encoded_dtype, m.shape, m.params, bufs)
        out = bridge.decode_tensor(enc)
        return out if out.dtype == m.dtype else out.to(m.dtype)


def _as_payload(buffers) -> tuple[tuple, tuple, tuple]:
    """numpy buffers -> (uint8 tensors sharing their memory, their numpy dtypes, the buffers
    as contiguous arrays: the same memory as the tensors)."""
    arrays = tuple(np.ascontiguousarray(b) for b in buffers)
    tensors = tuple(torch.from_numpy(a.reshape(-1).view(np.uint8)) for a in arrays)
    return tensors, tuple(a.dtype for a in arrays), arrays


def pack(t: torch.Tensor, setting: Setting) -> Packed:
    """Compress `t` as `setting` says. Tensors no codec can take (other devices until their
    path exists, integers that do not narrow) and `codec="keep"` come back as kind "kept"."""
    with _threads():
        return _pack(t, setting)


def _pack(t: torch.Tensor, setting: Setting) -> Packed:
    nbytes = t.numel() * t.element_size()
    if setting.codec != "keep" and t.dtype in _NARROWER:
        return _narrow(t, nbytes)
    if setting.codec == "keep" or (t.dtype not in FLOATS and t.dtype != torch.bool):
        return _kept(t, nbytes)
    shape = tuple(t.shape)
    if t.device.type != "cpu":
        return _pack_device(t, setting, shape, nbytes)
    if t.dtype == torch.bool:
        return _pack_bool(t, shape, nbytes)
    arr, tag = bridge.tensor_array(t)
    if setting.codec == "auto" and _dense_beyond_doubt(arr, setting):
        # Dense: the smallest encoding is k-bit dense (or raw), so skip the bitmap pass.
        if setting.bits is None:
            return _kept(t, nbytes)
        enc = auto.encode(arr, "quant", dtype=tag, **_codec_kwargs(setting))
    elif setting.codec in ("auto", "bitmap", "bitmap_quant"):
        # One bitmap pass gives the counts for the choice, the lossless encoding and the mask
        # test; quant of the nonzeros reuses it.
        lossless = bitmap.encode(arr, dtype=tag)
        values = lossless.buffers[1].view(_NP_UINT[arr.itemsize])
        if setting.codec == "auto" and _one_value(values):
            return _mask(lossless.buffers[0], values[:1].copy(), t.dtype, shape, nbytes)
        codec = setting.codec
        if codec == "auto":
            codec = auto.smallest(auto.sizes_from_counts(arr.size, values.size, arr.itemsize,
                                                         setting.bits, setting.group_size))
        if codec == "raw":  # a copy would hold the same bytes: keep the tensor itself
            return _kept(t, nbytes)
        if codec == "bitmap":
            enc = lossless
        elif codec == "bitmap_quant":
            enc = bitmap_quant.from_bitmap(lossless, _quant_params(setting))
        else:
            enc = auto.encode(arr, codec, dtype=tag, **_codec_kwargs(setting))
    else:
        enc = auto.encode(arr, setting.codec, dtype=tag, **_codec_kwargs(setting))
    payload, dtypes, arrays = _as_payload(enc.buffers)
    meta = Meta("encoded", enc.codec, t.dtype, shape, enc.params, enc.dtype, dtypes, nbytes)
    return Packed(meta, payload, arrays=arrays)


# Below this many elements `auto` takes the exact pass, which is cheap for them.
_SAMPLE_MIN = 64 * 1024


def _dense_beyond_doubt(arr: np.ndarray, setting: Setting) -> bool:
    """Whether a sample shows so many nonzero elements that no bitmap-based codec can be the
    smallest. The bitmap pass of `auto` costs about a copy of the tensor; most saved
    activations (convolution and norm inputs) are dense, and this skips it for them. The
    test is conservative: the sample's lower bound on the nonzero share
    (`ac_nonzero_share_floor`: 64 runs of 64 elements at hashed offsets, minus five standard
    errors) must still make k-bit dense (or the tensor as it is, when lossless) the smallest.
    A wrong call is rare, and costs bytes and, when lossy, the exact zeros bitmap_quant would
    have kept (a ReLU output's zeros decide its backward mask); never the lossless guarantee.
    A sample whose nonzero values all have one bit pattern might be a mask (dropout keeps
    most elements): no decision then."""
    n = arr.size
    if n < _SAMPLE_MIN:
        return False
    low, one_value = _ext.nonzero_share_floor(arr.reshape(-1).view(np.uint8), arr.itemsize)
    if one_value or low <= 0:
        return False
    sizes = auto.sizes_from_counts(n, int(low * n), arr.itemsize, setting.bits,
                                   setting.group_size)
    return auto.smallest(sizes) in ("quant", "raw")


def _one_value(values: np.ndarray) -> bool:
    """Whether every nonzero element has one bit pattern (a mask). Activations differ within
    their first few values, so a short prefix settles most tensors before the full pass."""
    if not values.size:
        return False
    first = values[0]
    return bool((values[:64] == first).all() and (values == first).all())


def _kept(t: torch.Tensor, nbytes: int) -> Packed:
    return Packed(Meta("kept", "keep", t.dtype, tuple(t.shape), original_nbytes=nbytes), (t,))


_NARROWER = {torch.int64: (torch.int8, torch.int16, torch.int32),
             torch.int32: (torch.int8, torch.int16), torch.int16: (torch.int8,)}


def _narrow(t, nbytes) -> Packed:
    """The smallest integer type holding every value (works on any device)."""
    shape = tuple(t.shape)
    if t.numel():
        lo, hi = (int(v) for v in torch.aminmax(t))
        for small in _NARROWER[t.dtype]:
            info = torch.iinfo(small)
            if info.min <= lo and hi <= info.max:
                return Packed(Meta("narrow", f"int{info.bits}", t.dtype, shape,
                                   original_nbytes=nbytes), (t.to(small),))
    return _kept(t, nbytes)


def _pack_device(t, setting, shape, nbytes) -> Packed:
    """Tensors on other devices: the same format, computed there with torch ops."""
    if t.dtype == torch.bool:
        return Packed(Meta("mask", "mask", t.dtype, shape, original_nbytes=nbytes),
                      (device.packbits(t),))
    enc = device.encode(t, setting.codec, **_codec_kwargs(setting))
    meta = Meta("device", enc.codec, t.dtype, shape, enc.params, enc.dtype, (),
                original_nbytes=nbytes)
    return Packed(meta, enc.buffers)


def _quant_params(s: Setting) -> dict:
    return quant.check_params(s.bits, s.group_size, s.rounding, "raise", s.seed % 2**64)


def _codec_kwargs(s: Setting) -> dict:
    if s.codec in ("raw", "bitmap") or s.bits is None:
        return {}
    return {"bits": s.bits, "group_size": s.group_size, "rounding": s.rounding,
            "seed": s.seed % 2**64}


def _pack_bool(t, shape, nbytes) -> Packed:
    flat = t.detach().contiguous().view(torch.uint8).numpy().reshape(-1)
    bits = np.packbits(flat, bitorder="little")
    return Packed(Meta("mask", "mask", t.dtype, shape, original_nbytes=nbytes),
                  (torch.from_numpy(bits),))


def _mask(bitmap_buf, value, dtype, shape, nbytes) -> Packed:
    payload = (torch.from_numpy(bitmap_buf), torch.from_numpy(value.view(np.uint8)))
    return Packed(Meta("mask", "mask", dtype, shape, original_nbytes=nbytes), payload)


def _unpack_mask(m: Meta, payload) -> torch.Tensor:
    n = int(np.prod(m.shape, dtype=np.int64))
    if m.dtype == torch.bool and payload[0].device.type != "cpu":
        return device.unpackbits(payload[0], n).view(m.shape)
    if m.dtype == torch.bool:
        bits = np.unpackbits(payload[0].numpy(), count=n, bitorder="little").view(bool)
        return torch.from_numpy(bits.reshape(m.shape))
    bitmap_buf, value = payload[0].numpy(), payload[1].numpy()
    values = np.tile(value, _ext.bitmap_count(bitmap_buf, n))
    out = torch.empty(m.shape, dtype=m.dtype)
    _ext.bitmap_decode(bitmap_buf, values, value.size, out.view(-1).view(torch.uint8).numpy())
    return out


def pack_mask(mask: torch.Tensor) -> Packed:
    """A bool tensor at 1 bit per element (ReLU and dropout masks)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"pack_mask needs a bool tensor, got {mask.dtype}")
    if mask.device.type != "cpu":
        return Packed(Meta("mask", "mask", mask.dtype, tuple(mask.shape),
                           original_nbytes=mask.numel()), (device.packbits(mask),))
    return _pack_bool(mask, tuple(mask.shape), mask.numel())


def save(ctx, *items) -> None:
    """`ctx.save_for_backward` for a mix of tensors, Packed and None: payload tensors go to
    autograd as non-differentiable uint8 tensors; their metadata rides on ctx."""
    tensors, layout = [], []
    for item in items:
        if isinstance(item, Packed):
            layout.append((item.meta, len(item.payload), item.on_decode))
            tensors.extend(item.payload)
        elif item is None:
            layout.append(None)
        else:
            layout.append((None, 1, None))
            tensors.append(item)
    ctx.save_for_backward(*tensors)
    ctx.actcodec_layout = layout


def load(ctx) -> list:
    """The items `save` stored, decompressed, in order (works for a second backward too)."""
    saved, out, i = ctx.saved_tensors, [], 0
    for entry in ctx.actcodec_layout:
        if entry is None:
            out.append(None)
            continue
        meta, count, on_decode = entry
        if meta is None:
            out.append(saved[i])
        else:
            out.append(Packed.restore(meta, saved[i:i + count], on_decode).unpack())
        i += count
    return out
