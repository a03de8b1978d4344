"""CPU min/max kernels: Numba ``prange`` over chunks, keys (see keys.py) reduced in registers.

A chunk (CHUNK_BYTES of one group) is the unit of parallel work; its keys are reduced by an
integer min/max loop that LLVM vectorizes, the lanes folded by a shuffle tree. The
strategies differ in how the chunk partials of a group are combined, as in DAF 3.2:

- ``tree``: every chunk writes its partial to memory; after the parallel loop the partials
  are combined pairwise, level by level (DAF's parallel reduction).
- ``atomic``: every chunk folds its partial into the group's result slot with a
  compare-and-swap loop (DAF Algorithm 1); no partials array, no second phase.
- ``hybrid``: chunks are grouped in blocks of BLOCK_CHUNKS; a block tree-combines its chunk
  partials locally and folds the block's result in atomically (DAF Figure 4).

Inputs of at most one chunk are reduced on the calling thread, and groups of at most one chunk
are reduced whole, one per iteration: there is nothing to combine, so no strategy applies.
Every kernel releases the GIL.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .atomics import atomic_max, atomic_min
from .keys import key

STRATEGIES = ("tree", "atomic", "hybrid")
CHUNK_BYTES = 256 << 10  # a task's overhead vanishes in its scan; 256 partials per 64 MiB
BLOCK_CHUNKS = 8  # hybrid: 2 MiB blocks, so 8x fewer atomics than chunks


@njit(inline="always")
def _scan(c):
    """(min key, max key) of a non-empty slice of bits."""
    lo = hi = key(c[0])
    # c[0] is folded twice, which min/max do not mind
    for i in range(c.size):
        k = key(c[i])
        lo = min(lo, k)
        hi = max(hi, k)
    return lo, hi


@njit(inline="always")
def _spans(n, group, span):
    """(spans per group, total spans) when each group is cut into `span`-element pieces; the
    last group is cut only up to n, so no piece is empty."""
    per = (group + span - 1) // span
    ngroups = (n + group - 1) // group
    last = n - (ngroups - 1) * group
    return per, (ngroups - 1) * per + (last + span - 1) // span


@njit(inline="always")
def _pairwise(plo, phi, first, count):
    """Fold partials [first, first + count) into index `first`, halving per level."""
    width = 1
    while width < count:
        for i in range(first, first + count - width, 2 * width):
            plo[i] = min(plo[i], plo[i + width])
            phi[i] = max(phi[i], phi[i + width])
        width *= 2


@njit(cache=True, nogil=True)
def _serial(b, group, lo, hi):
    for g in range(lo.size):
        lo[g], hi[g] = _scan(b[g * group:(g + 1) * group])


@njit(parallel=True, cache=True, nogil=True)
def _whole_groups(b, group, lo, hi):
    for g in prange(lo.size):
        lo[g], hi[g] = _scan(b[g * group:(g + 1) * group])


@njit(parallel=True, cache=True, nogil=True)
def _tree(b, group, chunk, lo, hi):
    per, units = _spans(b.size, group, chunk)
    plo = np.empty(units, b.dtype)
    phi = np.empty(units, b.dtype)
    for u in prange(units):
        g = u // per
        s = g * group + (u - g * per) * chunk
        plo[u], phi[u] = _scan(b[s:min(s + chunk, (g + 1) * group)])
    # one partial per chunk: the levels are too small to be worth waking the threads again
    for g in range(lo.size):
        first = g * per
        _pairwise(plo, phi, first, min(per, units - first))
        lo[g] = plo[first]
        hi[g] = phi[first]


@njit(parallel=True, cache=True, nogil=True)
def _atomic(b, group, chunk, lo, hi):
    per, units = _spans(b.size, group, chunk)
    for u in prange(units):
        g = u // per
        s = g * group + (u - g * per) * chunk
        klo, khi = _scan(b[s:min(s + chunk, (g + 1) * group)])
        atomic_min(lo, g, klo)
        atomic_max(hi, g, khi)


@njit(parallel=True, cache=True, nogil=True)
def _hybrid(b, group, chunk, lo, hi):
    span = chunk * BLOCK_CHUNKS
    per, blocks = _spans(b.size, group, span)
    for u in prange(blocks):
        g = u // per
        s = g * group + (u - g * per) * span
        e = min(s + span, (g + 1) * group, b.size)
        count = (e - s + chunk - 1) // chunk
        plo = np.empty(count, b.dtype)
        phi = np.empty(count, b.dtype)
        for c in range(count):
            plo[c], phi[c] = _scan(b[s + c * chunk:min(s + (c + 1) * chunk, e)])
        _pairwise(plo, phi, 0, count)
        atomic_min(lo, g, plo[0])
        atomic_max(hi, g, phi[0])


_KERNELS = {"tree": _tree, "atomic": _atomic, "hybrid": _hybrid}


def chunk_elements(itemsize: int) -> int:
    return CHUNK_BYTES // itemsize


def needs_strategy(n: int, group: int, itemsize: int) -> bool:
    """Whether chunk partials get combined at all (else every strategy runs the same code)."""
    chunk = chunk_elements(itemsize)
    return n > chunk and group > chunk


def reduce_keys(bits: np.ndarray, group: int, strategy: str):
    """(min keys, max keys) per group of `group` elements of flat int bits."""
    n = bits.size
    ngroups = -(-n // group)
    top = (1 << (8 * bits.itemsize - 1)) - 1
    lo = np.full(ngroups, top, bits.dtype)  # identities, for the atomic folds
    hi = np.full(ngroups, -top - 1, bits.dtype)
    chunk = chunk_elements(bits.itemsize)
    if n <= chunk:
        _serial(bits, group, lo, hi)
    elif group <= chunk:
        _whole_groups(bits, group, lo, hi)
    else:
        _KERNELS[strategy](bits, group, chunk, lo, hi)
    return lo, hi
