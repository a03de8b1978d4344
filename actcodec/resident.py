"""The process's resident memory as the operating system counts it: now, its high-water mark,
and the peak of a block of code (`Peak`), which is what a memory limit is about.

    with actcodec.resident.Peak() as p:
        train_step()
    p.nbytes                       # the block's peak RSS, in bytes

The peak comes from the kernel's own counter (Linux: VmHWM, reset through
/proc/self/clear_refs) where it can be reset; elsewhere, or where the reset is refused, a
thread samples RSS every `period` seconds (a lower bound: a spike between two reads is
missed).

`live()` is RSS less what the allocators hold free (glibc's free heap chunks, the activation
store's free pages): what a step starting now can count on as the process's floor."""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
import threading


def proc_kib(field: str, path: str = "/proc/self/status") -> int | None:
    """A "Field: N kB" line's N from a /proc file (the process's status by default; None
    where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss() -> int:
    """The process's resident bytes now."""
    kib = proc_kib("VmRSS")
    return kib * 1024 if kib is not None else peak_rss()


def peak_rss() -> int:
    """The process's resident high-water mark (since the last reset_peak)."""
    kib = proc_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024  # bytes on macOS, KiB elsewhere


def _reset_kernel_peak() -> bool:
    """Reset the kernel's high-water mark (Linux: VmHWM) to the current RSS; False where that
    is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    hwm, now = proc_kib("VmHWM"), proc_kib("VmRSS")
    return hwm is not None and now is not None and hwm <= now + 1024


class PeakCounter:
    """The one reader of a resettable high-water counter (the kernel's VmHWM for the
    process; a CUDA device's peak reserved bytes): the counter is global, so its reader is
    too. A reset would erase what every open `Peak` (in this thread or another) has not read
    yet, so each reset first folds the counter into all of them. Invariant: an open Peak's
    peak is max(its folded value, the counter now). `read()` gives the counter, `reset()`
    sets it to the current value and says whether it could. `shares`: a reader of another
    counter that the same reset sets back (a CUDA device's peak allocated and peak reserved
    bytes): the two take one lock, and a reset through either folds both."""

    def __init__(self, read, reset, shares: "PeakCounter | None" = None):
        self.read, self._reset = read, reset
        self.lock = threading.Lock() if shares is None else shares.lock
        self.group = [self] if shares is None else shares.group
        if shares is not None:
            self.group.append(self)
        self.open: set = set()

    def _fold(self) -> None:
        for counter in self.group:
            hwm = counter.read()
            for p in counter.open:
                p._peak = max(p._peak, hwm)

    def reset(self) -> bool:
        with self.lock:
            self._fold()
            return self._reset()

    def enter(self, p: "Peak") -> bool:
        with self.lock:
            self._fold()
            ok = self._reset()
            if ok:
                self.open.add(p)
            return ok

    def leave(self, p: "Peak") -> None:
        with self.lock:
            p._peak = max(p._peak, self.read())
            self.open.discard(p)


_READER = PeakCounter(lambda: peak_rss(), lambda: _reset_kernel_peak())  # looked up per call


def reset_peak() -> bool:
    """Reset the kernel's high-water mark (Linux: VmHWM) to the current RSS, after every open
    `Peak` has taken what it held; False where that is not possible."""
    return _READER.reset()


class Peak:
    """The peak RSS of the block it is entered for (`nbytes`, also readable inside it): the
    kernel's counter after a reset, or a sampling thread where no reset is possible (then
    `sampled` is True). Peaks nest and may run in several threads at once: a reset made
    inside one (another Peak, `reset_peak`) does not lose what the outer one had seen.
    `counter` and `now`: another resettable counter and its current value (a CUDA device's
    reserved bytes, actcodec.torch.limit.meter), the process's by default."""

    def __init__(self, period: float = 0.001, counter: PeakCounter | None = None, now=None):
        self.period = period
        self.sampled = False
        self._counter = counter if counter is not None else _READER
        self._now = now if now is not None else rss
        self._peak, self._stop, self._thread = 0, None, None

    def __enter__(self) -> "Peak":
        self._peak = self._now()
        self.sampled = not self._counter.enter(self)
        if self.sampled:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.sampled:
            self._stop.set()
            self._thread.join()
        else:
            self._counter.leave(self)

    @property
    def nbytes(self) -> int:
        if self.sampled or self._thread is not None:
            return max(self._peak, self._now())
        return max(self._peak, self._counter.read())

    def _sample(self) -> None:
        while not self._stop.wait(self.period):
            self._peak = max(self._peak, self._now())


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


class _Trimmed:
    """Bytes of glibc's free heap that are not resident (the heap is the process's): what
    trim_heap gave back, which glibc still counts as free. Reused, such bytes are resident
    again, so the count never exceeds the free heap seen since (`seen`): reuse takes the
    free chunks a trim left, as they are all a heap trimmed has free beyond its small
    remnants."""

    def __init__(self):
        self.lock = threading.Lock()
        self.nbytes = 0

    def seen(self, heap_free: int) -> int:
        """The bytes not resident, with the free heap now `heap_free` (call under lock)."""
        self.nbytes = min(self.nbytes, heap_free)
        return self.nbytes


_TRIMMED = _Trimmed()


def _malloc_trim():
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_MALLOC_TRIM = _malloc_trim()


def trim_heap() -> int:
    """Give the heap's free pages back to the system (glibc's malloc_trim; nothing
    elsewhere); returns the resident bytes given back. held_free() leaves them out."""
    if _MALLOC_TRIM is None:
        return 0
    with _TRIMMED.lock:
        h = heap()
        if h is not None:
            _TRIMMED.seen(h["heap_free"])
        before = rss()
        _MALLOC_TRIM(0)
        gone = max(0, before - rss())
        after = heap()
        if h is not None and after is not None:
            # the heap's top given back leaves the heap (and its free bytes); the rest of
            # what went stays free there, not resident
            _TRIMMED.nbytes += max(0, gone - max(0, h["heap"] - after["heap"]))
            _TRIMMED.seen(after["heap_free"])
    return gone


def _libc_mincore():
    try:
        fn = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p], ctypes.c_int
    return fn


_MINCORE = _libc_mincore()
_LOW_BIT = bytes(i & 1 for i in range(256))  # mincore's resident bit per page; others reserved


def main_heap() -> tuple[int, int] | None:
    """The main heap's (the "[heap]" mappings glibc's main arena grows by brk: one, or more
    where something split it) length and resident bytes (mincore); None where there is none
    or it cannot be read."""
    if _MINCORE is None:
        return None
    for _ in range(3):  # the heap's end moves where a free between the two reads shrank it
        try:
            with open("/proc/self/maps") as f:
                spans = [line.split(None, 1)[0] for line in f if line.endswith("[heap]\n")]
        except OSError:
            return None
        if not spans:
            return None
        length = resident_bytes = 0
        for span in spans:
            lo, hi = (int(x, 16) for x in span.split("-"))
            pages = (hi - lo + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if _MINCORE(lo, hi - lo, vec) != 0:
                break
            length += hi - lo
            resident_bytes += bytes(vec).translate(_LOW_BIT).count(1) * mmap.PAGESIZE
        else:
            return length, resident_bytes
    return None


def held_free() -> int:
    """Bytes the allocators hold but nothing uses: glibc's free heap chunks (0 elsewhere), less
    what trim_heap gave back (free, not resident), and the actcodec store's mapped pages
    outside live blocks. Free heap is counted only as far as the main heap's resident pages
    hold it beside the bytes in use (a heap grown by chunks never written, then freed, holds
    free bytes that never were resident: counted, live() fell below what was in use by as
    much). Some may still not be resident (another arena's), so RSS less these
    underestimates live bytes, and RSS / live errs high."""
    h = heap()
    free = 0
    if h is not None:
        with _TRIMMED.lock:
            free = h["heap_free"] - _TRIMMED.seen(h["heap_free"])
        main = main_heap()
        if main is not None:
            length, resident_bytes = main
            # the bytes in use taken as resident (written, as a tensor's are), every other
            # arena's as resident free at most
            bound = resident_bytes + max(0, h["heap"] - length) - h["heap_used"]
            free = max(0, min(free, bound))
    from . import store

    for made in store.made():
        st = made.stats()
        free += st["mapped_bytes"] - st["used_bytes"]
    return free


def live() -> int:
    """The process's live bytes now: RSS less held_free()."""
    return rss() - held_free()
