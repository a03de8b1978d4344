"""The one call the autograd Functions make: compress a tensor for backward as the policy
says for this op and layer, and record it in the active accounting."""
from __future__ import annotations

import time

import torch

from . import accounting, packing
from .policy import Policy


def store(t: torch.Tensor, policy: Policy, op: str, layer: str | None = None) -> packing.Packed:
    """A Packed for `packing.save`; kind "kept" when the policy keeps `t` as it is."""
    setting = policy.setting(op, layer, t.numel() * t.element_size())
    t0 = time.perf_counter()
    packed = packing.pack(t.detach(), setting)
    _record(packed, op, layer, time.perf_counter() - t0)
    return packed


def store_mask(mask: torch.Tensor, op: str, layer: str | None = None) -> packing.Packed:
    """A bool mask at 1 bit per element (exact, whatever the policy)."""
    t0 = time.perf_counter()
    packed = packing.pack_mask(mask)
    _record(packed, op, layer, time.perf_counter() - t0)
    return packed


def _record(packed, op, layer, seconds) -> None:
    acc = accounting.current()
    if acc is None:
        return
    if packed.meta.kind == "kept":
        acc.kept += 1
    else:
        acc.add(layer, op, packed, seconds)
