"""The torch backend of the core (actcodec.backends): CPU tensors go to the C codecs through
zero-copy numpy views of their memory, and decode writes straight into a tensor's memory;
tensors on other devices go to actcodec.torch.device, which computes the same format with
torch ops on their own device. Importing actcodec.torch registers it."""
from __future__ import annotations

import numpy as np
import torch

from ... import _options, backends, container, encoder
from . import fused
from .dtypes import BITS, NAMES, TORCH_DTYPES, UNSIGNED

def dtype_name(t: torch.Tensor) -> str:
    if t.dtype not in NAMES:
        raise TypeError(f"unsupported tensor dtype {t.dtype}; actcodec encodes float16, "
                        f"bfloat16, float32, float64 and (raw, mask) bool")
    return NAMES[t.dtype]


def host_bits(t: torch.Tensor) -> tuple[np.ndarray, str]:
    """A flat unsigned numpy view of a CPU tensor's element bits (copied once if the tensor is
    not contiguous, or is a lazy negation/conjugate view), and its dtype name."""
    name = dtype_name(t)
    t = t.detach()
    if t.is_neg() or t.is_conj():
        t = t.resolve_neg().resolve_conj()
    if not t.is_contiguous():
        t = t.contiguous()
    return bits_of(t), name


def bits_of(t: torch.Tensor) -> np.ndarray:
    """The element bits of a contiguous CPU tensor of a codec dtype, as flat unsigned numpy."""
    flat = t.reshape(-1).view(BITS[t.dtype]).numpy()
    return flat.view(UNSIGNED[flat.itemsize])


def wrap(buf: np.ndarray) -> torch.Tensor:
    """A host buffer as a uint8 tensor on the same memory."""
    return torch.from_numpy(buf)


def byte_view(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a flat writable numpy view."""
    if t.numel() == 0:
        return np.empty(0, np.uint8)
    return t.reshape(-1).view(torch.uint8).numpy()


def encode(t: torch.Tensor, codec: str = "auto", **params) -> container.Encoded:
    """`actcodec.encode` for a tensor: buffers are uint8 tensors on its device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    return encoder.encode(t, codec, **params)


def decode(enc: container.Encoded, out: torch.Tensor | None = None, dtype=None, *,
           threads: int | None = None, simd: str | None = None) -> torch.Tensor:
    """Decode into a new tensor, or into `out` (a tensor of this shape and dtype whose
    elements are dense in memory: contiguous, channels_last, a transpose; the elements go
    in its memory order), on the buffers' device. Numpy buffers decode to a CPU tensor."""
    if isinstance(dtype, torch.dtype):
        if dtype not in NAMES:
            raise TypeError(f"cannot decode to {dtype}")
        dtype = NAMES[dtype]
    target = enc.decode_dtype(dtype)
    where = enc.device if enc.is_torch else torch.device("cpu")
    if out is None:
        out = torch.empty(enc.shape, dtype=TORCH_DTYPES[target], device=where)
    else:
        _check_out(out, enc, target, where)
    if where.type != "cpu":
        fused.route(out).decode_into(enc, memory_order(out), target)
        return out
    enc.decode_into(byte_view(memory_order(out)), target, _options.resolve(threads, simd))
    return out


def memory_order(t: torch.Tensor) -> torch.Tensor:
    """t with its dimensions permuted into memory order: a contiguous view of a tensor whose
    elements are dense in memory (ValueError otherwise)."""
    if t.is_contiguous():
        return t
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.shape[d]))
    view = t.permute(order)
    if not view.is_contiguous():
        raise ValueError(f"a tensor with strides {tuple(t.stride())} has gaps or overlaps; "
                         f"decode into a dense one")
    return view


def _check_out(out, enc, target, device):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a tensor, got {type(out).__name__}")
    if out.dtype != TORCH_DTYPES[target]:
        raise TypeError(f"out has dtype {out.dtype}, expected {TORCH_DTYPES[target]}")
    if tuple(out.shape) != tuple(enc.shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(enc.shape)}")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, the encoding on {device}")


class TorchBackend:
    """What the core needs of torch tensors (see actcodec.backends)."""

    name = "torch"

    @staticmethod
    def host_bits(t):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            return None
        flat, name = host_bits(t)
        return flat, name, tuple(int(d) for d in t.shape)

    wrap = staticmethod(wrap)

    @staticmethod
    def encode(t, codec, **settings):
        return fused.route(t).encode(t, codec, **settings)  # modules, not the method below

    @staticmethod
    def decode(enc, out, dtype, *, threads=None, simd=None):
        return decode(enc, out, dtype, threads=threads, simd=simd)

    @staticmethod
    def host_bytes(buf) -> np.ndarray:
        if buf.device.type != "cpu":
            raise ValueError(f"buffer is on {buf.device}; copy it to the CPU first")
        return byte_view(buf.detach())

    @staticmethod
    def to_numpy(buf) -> np.ndarray:
        return byte_view(buf.detach().to("cpu"))

    @staticmethod
    def device(buf):
        return buf.device

    @staticmethod
    def from_numpy(buf, where):
        if isinstance(buf, torch.Tensor):
            return buf.to(where)
        buf = np.asarray(buf)
        return torch.from_numpy(buf if buf.flags.writeable else buf.copy()).to(where)


backends.register("torch", TorchBackend())
