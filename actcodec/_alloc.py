"""Payload memory. Each encoding takes one block from an allocator and lays its buffers out
in it, each at a 64-byte boundary: one allocation per encoding, so a step's payloads never
leave small holes between one another, and a block the encoder sized for the worst case is
cut once to what it wrote.

An allocator is a callable nbytes -> flat uint8 numpy array (uninitialized) for a block of
known size, with `scratch(nbytes)` for one sized for the worst case and `shrink(block, nbytes)
-> block` to keep only its first nbytes (before any view of it exists; the result may be a
new block holding a copy: `cuts_in_place` says which). HEAP takes blocks from numpy and cuts
them in place; StoreAlloc takes them from a store's pages (actcodec.store) and copies the cut
into a block of its own, so no worst case ever sits among a step's payloads."""
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

    cuts_in_place = True  # shrink keeps the block: cutting costs nothing

    def __call__(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    scratch = __call__

    def shrink(self, block: np.ndarray, nbytes: int) -> np.ndarray:
        block.resize(nbytes, refcheck=False)  # realloc in place: no view of block exists yet
        return block


HEAP = HeapAlloc()


class StoreAlloc:
    """The allocator protocol over an actcodec Store: blocks as flat uint8 arrays whose pages
    go back to the store with the last array (or tensor) on them. Blocks sized for the worst
    case come from `scratch` (numpy by default) and their cut is copied into the store, so
    the store holds exact payloads only and no worst case raises its high-water mark."""

    __slots__ = ("store", "scratch")
    cuts_in_place = False

    def __init__(self, store, scratch=None):
        self.store = store
        self.scratch = scratch if scratch is not None else HEAP

    def __call__(self, nbytes: int) -> np.ndarray:
        return np.frombuffer(self.store.block(nbytes), np.uint8)

    def shrink(self, block: np.ndarray, nbytes: int) -> np.ndarray:
        out = self(nbytes)
        out[:] = block[:nbytes]
        return out
