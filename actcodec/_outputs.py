"""Where decoded arrays live. glibc serves allocations of 32 MiB and more (its largest mmap
threshold) with fresh pages every time, and a decoder that writes such an array takes one
page fault per 4 KiB of it: measured here, decoding 64 MiB took 16-22 ms into fresh pages and
4-5 ms into touched ones. Arrays that large get a mapping of their own with transparent huge
pages asked for (one fault per 2 MiB): 6-7 ms. Smaller arrays come from numpy as usual, where
glibc may hand back memory it already has, which costs no faults at all.

A process that has told glibc to keep large blocks too (a raised MALLOC_MMAP_THRESHOLD_, or
mallopt) reuses memory at every size, and a kernel that compacts memory to assemble huge pages
(THP defrag "madvise") can stall a fault; `set_own_mapping_bytes(None)` then leaves every
array to numpy."""
from __future__ import annotations

from math import prod

import numpy as np

from . import _ext

DEFAULT_OWN_MAPPING_BYTES = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
OWN_MAPPING_BYTES: int | None = DEFAULT_OWN_MAPPING_BYTES


def set_own_mapping_bytes(nbytes: int | None) -> None:
    """Decoded arrays of at least `nbytes` get a mapping of their own (huge pages asked for);
    None: never. The default is 32 MiB."""
    global OWN_MAPPING_BYTES
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int)
                               or nbytes < 0):
        raise ValueError(f"own-mapping threshold must be an int >= 0 or None, got {nbytes!r}")
    OWN_MAPPING_BYTES = nbytes


def get_own_mapping_bytes() -> int | None:
    return OWN_MAPPING_BYTES


def empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array, in memory of its own when it is large."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = prod(shape) * dtype.itemsize
    threshold = OWN_MAPPING_BYTES
    if threshold is None or nbytes < max(threshold, 1):
        return np.empty(shape, dtype)
    return np.frombuffer(_ext.PageBuffer(nbytes), dtype).reshape(shape)
