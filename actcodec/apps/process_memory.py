"""What the process holds beyond its resident bytes (actcodec.resident: RSS, its high-water
mark): glibc's own heap statistics (mallinfo2), the bytes the allocators hold free, the live
bytes (RSS less those), and a thread that samples the live bytes' peak."""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
import time

from actcodec.resident import peak_rss, reset_peak, rss  # noqa: F401  (the apps' readers)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        fn = libc.mallinfo2
    except (OSError, AttributeError, TypeError):  # not glibc, or before 2.33
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def heap() -> dict | None:
    """glibc's own statistics now (mallinfo2): the heap's size, its bytes in use and free, and
    the bytes in mmapped chunks; None under another allocator or an older glibc."""
    if _MALLINFO2 is None:
        return None
    m = _MALLINFO2()
    return {"heap": m.arena, "heap_used": m.uordblks, "heap_free": m.fordblks,
            "mmapped": m.hblkhd}


def held_free() -> int:
    """Bytes the allocators hold but nothing uses: glibc's free heap chunks (0 elsewhere), less
    what the heap gave back when actcodec's allocator was installed (free, not resident), and
    the actcodec store's mapped pages outside live blocks. Some of them may still not be
    resident, so RSS less these underestimates live bytes, and RSS / live errs high."""
    h = heap()
    free = h["heap_free"] if h is not None else 0
    allocator = sys.modules.get("actcodec.torch.allocator")
    if allocator is not None:
        free = max(0, free - allocator.trimmed_bytes())
    from actcodec import store

    for made in store.made():
        st = made.stats()
        free += st["mapped_bytes"] - st["used_bytes"]
    return free


def live() -> int:
    """The process's live bytes now: RSS less held_free()."""
    return rss() - held_free()


class Sampler(threading.Thread):
    """The peak of live bytes (RSS less held_free), read every `period` seconds."""

    def __init__(self, period: float = 0.002):
        super().__init__(daemon=True)
        self.period, self.peak_live, self.on = period, 0, False
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            if self.on:
                self.peak_live = max(self.peak_live, live())
            time.sleep(self.period)
