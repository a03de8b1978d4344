"""numpy arrays and torch tensors side by side, without importing torch: buffers of an
encoding are 1-D uint8 arrays of either kind, and the C path reads CPU tensors through
zero-copy numpy views."""
from __future__ import annotations

import sys

import numpy as np


def is_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def on_host(buf) -> bool:
    """Whether the C path can read `buf` in place (numpy, or a CPU tensor)."""
    return not is_tensor(buf) or buf.device.type == "cpu"


def host_bytes(buf) -> np.ndarray:
    """A flat uint8 numpy view of a contiguous buffer on the host (no copy)."""
    if is_tensor(buf):
        if buf.device.type != "cpu":
            raise ValueError(f"buffer is on {buf.device}; copy it to the CPU first")
        if buf.numel() == 0:
            return np.empty(0, np.uint8)
        return buf.detach().reshape(-1).view(_torch().uint8).numpy()
    arr = np.asarray(buf)
    return arr.reshape(-1).view(np.uint8)


def nbytes(buf) -> int:
    return buf.numel() * buf.element_size() if is_tensor(buf) else buf.nbytes


def to_numpy(buf) -> np.ndarray:
    """A host copy of a device buffer, or the host buffer itself, as flat uint8 numpy."""
    if is_tensor(buf) and buf.device.type != "cpu":
        buf = buf.to("cpu")
    return host_bytes(buf)


def _torch():
    import torch

    return torch
