"""Where decoded arrays live. glibc serves allocations of 32 MiB and more (its largest mmap
threshold) with fresh pages every time, and a decoder that writes such an array takes a page
fault per page. torch's CPU allocator asks for no huge pages, so that is one fault per 4 KiB:
measured here, decoding a 64 MiB float32 tensor took 27-29 ms into `torch.empty` (its
`clone()` as long) and 5.5-6.5 ms into a mapping of our own with transparent huge pages asked
for. numpy already asks for huge pages on large arrays; there the gain is smaller (2-bit
decode of 64 MiB: 8.2-8.7 ms into `np.empty`, 6.3-6.4 ms here). Smaller arrays come from numpy
as usual, where glibc may hand back memory it already has and no fault happens at all: giving
a training step's 1-16 MiB tensors mappings of their own made its decoding 3.6x slower.
The bitmap encoder puts its worst-case values buffer in such a mapping by the same threshold
(actcodec/_bitmap.pxi) and unmaps the tail it did not write.

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


def own_mapping(nbytes: int) -> bool:
    """Whether an output of `nbytes` gets a mapping of its own (never an empty one)."""
    threshold = OWN_MAPPING_BYTES
    return threshold is not None and nbytes >= max(threshold, 1)


def empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array, in memory of its own when it is large."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = prod(shape) * dtype.itemsize
    if not own_mapping(nbytes):
        return np.empty(shape, dtype)
    return np.frombuffer(_ext.PageBuffer(nbytes), dtype).reshape(shape)
