"""Zero-copy bridge between CPU tensors and the codecs: the codec reads the tensor's memory
through a numpy view, and decoding writes straight into a new tensor's memory. Tensors on other
devices go through the torch implementation in `device` (same format, computed on the device)."""
from __future__ import annotations

import numpy as np
import torch

from .. import _outputs, auto, container
from . import device

_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}
_NAMES = {v: k for k, v in _TORCH.items()}


def tensor_array(t: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """A numpy view of a CPU tensor's elements (copied once if not contiguous), and the
    bfloat16 tag when numpy needs one."""
    if t.device.type != "cpu":
        raise ValueError(f"tensor is on {t.device}; actcodec's codecs run on CPU tensors "
                         f"(move it with .cpu(), or keep it uncompressed)")
    if t.dtype not in _TORCH.values():
        raise TypeError(f"unsupported tensor dtype {t.dtype}; actcodec encodes float16, "
                        f"bfloat16, float32 and float64")
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    return t.numpy(), None


def encode_tensor(t: torch.Tensor, codec: str = "auto",
                  **params) -> container.Encoded | device.DeviceEncoded:
    """Encode a tensor with a named codec (or "auto"); params as for actcodec.encode. CPU
    tensors give a container.Encoded; tensors on other devices a device.DeviceEncoded whose
    buffers stay on that device."""
    if isinstance(t, torch.Tensor) and t.device.type != "cpu":
        return device.encode(t, codec, **params)
    arr, tag = tensor_array(t)
    return auto.encode(arr, codec, dtype=tag, **params)


def decode_tensor(enc: container.Encoded | device.DeviceEncoded,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """Decode into a new tensor of the encoded dtype (or float32 for quantized codecs): on the
    CPU for a container.Encoded, on the buffers' device for a device.DeviceEncoded."""
    if isinstance(enc, device.DeviceEncoded):
        return device.decode(enc, dtype)
    if dtype is not None and dtype not in _NAMES:
        raise TypeError(f"cannot decode to {dtype}; choose one of {', '.join(map(str, _NAMES))}")
    name = enc.dtype if dtype is None else _NAMES[dtype]
    # The array from _outputs (memory of its own when large), the tensor on top of it.
    view = _outputs.empty(enc.shape, np.uint16 if name == "bfloat16" else name)
    enc.decode(out=view, dtype=name)
    if name == "bfloat16":
        return torch.from_numpy(view.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(view)
