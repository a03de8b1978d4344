"""A context that compresses every activation autograd saves, for any model, through the
public `torch.autograd.graph.saved_tensors_hooks`.

Kept as they are: parameters (leaf tensors that require grad), integer tensors, tensors on
other devices than the CPU, and tensors smaller than `min_bytes`. bool tensors (dropout masks)
and float tensors whose nonzero elements all have one value (CPU dropout's scaled masks,
0/1 masks) are stored at 1 bit per element plus that value, exactly. A tensor saved by several ops (same storage, offset, shape,
strides and version) is encoded once; the encoding is freed when the last op that saved it is
done. Non-reentrant `torch.utils.checkpoint` installs hooks of its own inside its region, so
tensors saved there are recomputed rather than compressed; the checkpoint's own inputs, saved
outside, are compressed.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import _ext, auto, bitmap, bitmap_quant, quant
from . import bridge

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass
class Policy:
    """How saved activations are stored. bits=None: lossless only (bitmap when sparse, else
    raw); bits=k: the smallest of k-bit quantization (dense or of the nonzeros), bitmap, raw.
    This applies one setting to every saved tensor; per-op sensitivity is not modelled yet."""

    bits: int | None = None
    group_size: int | None = 256
    rounding: str = "nearest"
    seed: int = 0
    min_bytes: int = 16 * 1024

    @classmethod
    def preset(cls, name: str) -> "Policy":
        """A named policy: "lossless", "8bit", "4bit", "2bit" or "auto"."""
        presets = {"lossless": {}, "8bit": {"bits": 8}, "4bit": {"bits": 4},
                   "2bit": {"bits": 2}, "auto": {"bits": 4}}
        if name not in presets:
            raise ValueError(f"unknown policy preset {name!r}; known: {', '.join(presets)}")
        return cls(**presets[name])

    def params(self, step: int) -> dict:
        return {"bits": self.bits, "group_size": self.group_size, "rounding": self.rounding,
                "seed": (self.seed + step) % 2**64}


@dataclass
class SavedStats:
    """What one context saved: exact bytes of the unique tensors it compressed."""

    tensors: int = 0            # unique tensors compressed
    deduplicated: int = 0       # saves served by an encoding made earlier in the step
    kept: int = 0               # saves left as they were (params, ints, small, other devices)
    original_bytes: int = 0
    compressed_bytes: int = 0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    codecs: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.original_bytes / self.compressed_bytes if self.compressed_bytes else 1.0

    def __str__(self) -> str:
        codecs = ", ".join(f"{k}: {v}" for k, v in sorted(self.codecs.items()))
        return (f"{self.tensors} tensors compressed ({self.deduplicated} repeat saves shared, "
                f"{self.kept} kept as is): {self.original_bytes / 2**20:.2f} MiB -> "
                f"{self.compressed_bytes / 2**20:.2f} MiB ({self.ratio:.2f}x); codecs {codecs}; "
                f"encode {self.encode_seconds * 1e3:.1f} ms, decode "
                f"{self.decode_seconds * 1e3:.1f} ms")


class _Packed:
    """One compressed saved tensor: an Encoded, or a mask (a bitmap, plus for float masks the
    bit pattern of the one nonzero value)."""

    __slots__ = ("enc", "dtype", "shape", "mask_value", "__weakref__")

    def __init__(self, enc, dtype, shape, mask_value=None):
        self.enc, self.dtype, self.shape, self.mask_value = enc, dtype, shape, mask_value

    @property
    def is_mask(self) -> bool:
        return isinstance(self.enc, np.ndarray)

    @property
    def nbytes(self) -> int:
        extra = 0 if self.mask_value is None else self.mask_value.nbytes
        return self.enc.nbytes + extra

    def unpack(self) -> torch.Tensor:
        if not self.is_mask:
            return bridge.decode_tensor(self.enc)
        n = int(np.prod(self.shape))
        if self.mask_value is None:  # a bool tensor
            bits = np.unpackbits(self.enc, count=n, bitorder="little").view(bool)
            return torch.from_numpy(bits.reshape(self.shape))
        values = np.full(_ext.bitmap_count(self.enc, n), self.mask_value[0])
        out = torch.empty(self.shape, dtype=self.dtype)
        flat = out.view(-1).view(torch.uint8).numpy()
        _ext.bitmap_decode(self.enc, values.view(np.uint8), values.itemsize, flat)
        return out


class compress_saved:
    """Context manager: `with compress_saved(bits=8): loss = model(x)`; `.stats` afterwards."""

    def __init__(self, policy: Policy | None = None, *, step: int = 0, **policy_kwargs):
        self.policy = policy if policy is not None else Policy(**policy_kwargs)
        self.step = step
        self.stats = SavedStats()
        # (data_ptr, offset, shape, stride, version) -> (tensor ref, packed ref)
        self._seen: dict = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._seen.clear()
        return self._hooks.__exit__(*exc)

    def _keep(self, t: torch.Tensor) -> bool:
        return (t.device.type != "cpu" or (t.is_leaf and t.requires_grad)
                or isinstance(t, torch.nn.Parameter)
                or (t.dtype not in _FLOATS and t.dtype != torch.bool)
                or t.numel() * t.element_size() < self.policy.min_bytes)

    def _pack(self, t: torch.Tensor):
        if self._keep(t):
            self.stats.kept += 1
            return t
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               tuple(t.stride()), t._version)
        hit = self._seen.get(key)
        if hit is not None:
            tensor_ref, packed_ref = hit
            packed = packed_ref()
            if tensor_ref() is not None and packed is not None:  # the same live tensor
                self.stats.deduplicated += 1
                return packed
        t0 = time.perf_counter()
        packed, codec = self._encode(t)
        self.stats.encode_seconds += time.perf_counter() - t0
        self.stats.tensors += 1
        self.stats.original_bytes += t.numel() * t.element_size()
        self.stats.compressed_bytes += packed.nbytes
        self.stats.codecs[codec] = self.stats.codecs.get(codec, 0) + 1
        self._seen[key] = (weakref.ref(t), weakref.ref(packed))
        return packed

    def _encode(self, t: torch.Tensor):
        shape = tuple(t.shape)
        if t.dtype == torch.bool:
            flat = t.detach().contiguous().view(torch.uint8).numpy().reshape(-1)
            return _Packed(np.packbits(flat, bitorder="little"), t.dtype, shape), "mask"
        arr, tag = bridge.tensor_array(t)
        lossless = bitmap.encode(arr, dtype=tag)
        values = lossless.buffers[1].view(f"u{arr.itemsize}")
        if values.size and (values == values[0]).all():  # 0/c masks: 1 bit and one value
            return _Packed(lossless.buffers[0], t.dtype, shape, values[:1].copy()), "mask"
        # Choose from the counts this pass already has, and reuse it where it fits.
        p = self.policy.params(self.step)
        codec = auto.smallest(auto.sizes_from_counts(arr.size, values.size, arr.itemsize,
                                                     p["bits"], p["group_size"]))
        if codec == "bitmap":
            enc = lossless
        elif codec == "bitmap_quant":
            enc = bitmap_quant.from_bitmap(lossless, quant.check_params(
                p["bits"], p["group_size"], p["rounding"], "raise", p["seed"]))
        else:
            enc = bridge.encode_tensor(t, codec, **p)
        return _Packed(enc, t.dtype, shape), codec

    def _unpack(self, packed):
        if not isinstance(packed, _Packed):
            return packed
        t0 = time.perf_counter()
        out = packed.unpack()
        self.stats.decode_seconds += time.perf_counter() - t0
        return out
