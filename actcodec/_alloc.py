"""Payload memory. Each encoding takes one block from an allocator and lays its buffers out
in it, each at a 64-byte boundary: one allocation per encoding, so a step's payloads never
leave small holes between one another, and a block the encoder sized for the worst case is
cut once to what it wrote.

An allocator is a callable nbytes -> flat uint8 numpy array (uninitialized), with
`shrink(block, nbytes) -> block` giving back all but the first nbytes (before any view of the
block exists). HEAP takes blocks from numpy; actcodec.torch's store takes them from pages of
its own."""
from __future__ import annotations

import numpy as np

ALIGN = 64


def offsets(sizes) -> tuple[list, int]:
    """Where each buffer of `sizes` bytes starts in a block, and the block's size."""
    out, pos = [], 0
    for n in sizes:
        out.append(pos)
        pos += -(-n // ALIGN) * ALIGN
    return out, (out[-1] + sizes[-1] if sizes else 0)


def carve(block: np.ndarray, sizes) -> list:
    """The buffers of `sizes` bytes as views of `block` (laid out by `offsets`)."""
    starts, _ = offsets(sizes)
    return [block[s:s + n] for s, n in zip(starts, sizes)]


class HeapAlloc:
    """Blocks from numpy (glibc's heap)."""

    def __call__(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def shrink(self, block: np.ndarray, nbytes: int) -> np.ndarray:
        block.resize(nbytes, refcheck=False)  # realloc in place: no view of block exists yet
        return block


HEAP = HeapAlloc()
