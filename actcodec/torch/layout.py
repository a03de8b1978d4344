"""Saved tensors come back as they were saved: shape, strides (so memory format: channels_last,
transposes, slices of a wider tensor), dtype, the address's alignment within 64 bytes, and
broadcast (stride-0) dimensions. Kernels pick their paths from layouts, so this is what lets
lossless compression leave every gradient bit as plain PyTorch computes it.

What is encoded is the tensor's elements in memory order: with its broadcast dimensions
narrowed to one element, a tensor whose elements are dense in memory (a permutation of a
contiguous one) is encoded in place, without a copy, and decoded straight into memory laid out
as the original; a tensor with gaps (a slice) is copied once to encode and restored through a
copy into memory with the original's gaps, allocated but never read.
"""
from __future__ import annotations

import torch

ALIGN = 64  # bytes; the CPU allocator's alignment


class Layout:
    """How to rebuild one saved tensor (see the module docstring)."""

    __slots__ = ("shape", "stride", "dtype", "device", "align", "order", "dense", "expand")

    def __init__(self, base: torch.Tensor, expand: tuple | None):
        self.shape, self.stride = tuple(base.shape), tuple(base.stride())
        self.dtype, self.device, self.expand = base.dtype, base.device, expand
        self.align = base.data_ptr() % ALIGN
        self.order = memory_order(self.shape, self.stride)
        self.dense = _dense(self.shape, self.stride, self.order)

    def empty(self) -> torch.Tensor:
        """Uninitialized memory laid out as the original (before any broadcast)."""
        item = self.dtype.itemsize
        if self.align == 0 or self.align % item:
            storage_offset = 0
        else:
            storage_offset = self.align // item
        span = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.stride)) if all(
            self.shape) else 0
        if storage_offset == 0 and self.dense:
            return torch.empty_strided(self.shape, self.stride, dtype=self.dtype,
                                       device=self.device)
        storage = torch.empty(storage_offset + span, dtype=self.dtype, device=self.device)
        return storage.as_strided(self.shape, self.stride, storage_offset)

    def in_memory_order(self, t: torch.Tensor) -> torch.Tensor:
        """t's dimensions permuted into memory order (contiguous when t is dense)."""
        return t.permute(self.order)

    def finish(self, t: torch.Tensor) -> torch.Tensor:
        """The broadcast dimensions put back (a view, nothing copied)."""
        return t.expand(self.expand) if self.expand is not None else t


def capture(t: torch.Tensor) -> tuple[Layout, torch.Tensor] | None:
    """(layout, the elements to encode as one contiguous tensor) for a saved tensor, or None
    for one whose elements overlap in memory (kept as it is)."""
    base, expand = t.detach(), None
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if stride == 0 and size > 1:
            base = base.narrow(d, 0, 1)
    if base.shape != t.shape:
        expand = tuple(t.shape)
    layout = Layout(base, expand)
    if not _non_overlapping(layout.shape, layout.stride):
        return None
    source = layout.in_memory_order(base)
    if not source.is_contiguous():  # gaps between the elements: one copy
        source = source.contiguous()
    return layout, source


def restore(layout: Layout, fill) -> torch.Tensor:
    """A tensor laid out as `layout`, whose elements `fill(dest)` writes into `dest`, a
    contiguous tensor in memory order (the new memory itself when the layout is dense)."""
    out = layout.empty()
    ordered = layout.in_memory_order(out)
    if ordered.is_contiguous():
        fill(ordered)
    else:
        dense = torch.empty(ordered.shape, dtype=layout.dtype, device=layout.device)
        fill(dense)
        ordered.copy_(dense)
    return layout.finish(out)


def memory_order(shape, stride) -> list:
    """Dimensions from the largest stride to the smallest (ties, which only size-1
    dimensions can make, in order)."""
    return sorted(range(len(shape)), key=lambda d: (-stride[d], d))


def _dense(shape, stride, order) -> bool:
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != expected:
            return False
        expected *= shape[d]
    return True


def _non_overlapping(shape, stride) -> bool:
    span = 0
    for size, st in sorted(((s, st) for s, st in zip(shape, stride) if s > 1),
                           key=lambda p: p[1]):
        if st <= span:
            return False
        span += st * (size - 1)
    return True
