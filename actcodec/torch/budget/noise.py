"""The noise model: how much error each choice of bits and group size would add to a save,
relative to its energy, from the group ranges the quantizer computed anyway (or the tensor's
own, per group). How much of it reaches the gradients is the site's gain (planner.Site)."""
from __future__ import annotations

import math

import numpy as np
import torch

from ... import choice
from .planner import GROUPS


def noise_at_one_bit(t: torch.Tensor, enc) -> dict:
    """Per group size, the relative noise energy 1-bit quantization of t would add:
    from the group minima and step sizes of its encoding `enc` (quant or bitmap_quant; group
    sizes its own and coarser), else from t's own min/max per group."""
    energy = squared_norm(t.detach())
    if energy == 0 or not math.isfinite(energy):
        return {g: 0.0 for g in GROUPS}
    if enc is not None and enc.codec in choice.LOSSY and enc.params["group_size"] in GROUPS:
        bits, group = enc.params["bits"], enc.params["group_size"]
        mins, scales = (_floats(b) for b in enc.buffers[-2:])  # the last two: stats per group
        lo, hi = mins, mins + scales * ((1 << bits) - 1)
    else:
        group = GROUPS[0]
        flat = _padded(t.detach().reshape(-1).float(), group)  # a short last group: its own
        lo, hi = torch.aminmax(flat.view(-1, group), dim=1)
        lo, hi = lo.double(), hi.double()
    out = {}
    for g in GROUPS:
        if g % group:
            continue
        k = g // group
        glo = _padded(lo, k).view(-1, k).amin(dim=1)
        ghi = _padded(hi, k).view(-1, k).amax(dim=1)
        out[g] = float(((ghi - glo) ** 2).sum()) * g / 12.0 / energy
    return out


def squared_norm(t) -> float:
    """A tensor's energy, its squared norm accumulated in float32 (0 for anything else)."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return 0.0
    return float(torch.linalg.vector_norm(t, dtype=torch.float32)) ** 2


def _padded(v: torch.Tensor, k: int) -> torch.Tensor:
    """v to a multiple of k elements, its last element repeated (which changes no group's
    minimum or maximum)."""
    short = -v.numel() % k
    return torch.cat([v, v[-1:].expand(short)]) if short else v


def _floats(buf) -> torch.Tensor:
    """A payload buffer of float32 values as a float64 tensor."""
    if isinstance(buf, torch.Tensor):
        return buf.view(torch.float32).double()
    return torch.from_numpy(np.asarray(buf).view(np.float32)).double()
