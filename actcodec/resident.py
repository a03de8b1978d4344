"""The process's resident memory as the operating system counts it: now, its high-water mark,
and the peak of a block of code (`Peak`), which is what a memory limit is about.

    with actcodec.resident.Peak() as p:
        train_step()
    p.nbytes                       # the block's peak RSS, in bytes

The peak comes from the kernel's own counter (Linux: VmHWM, reset through
/proc/self/clear_refs) where it can be reset; elsewhere, or where the reset is refused, a
thread samples RSS every `period` seconds (a lower bound: a spike between two reads is
missed)."""
from __future__ import annotations

import sys
import threading


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss() -> int:
    """The process's resident bytes now."""
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else peak_rss()


def peak_rss() -> int:
    """The process's resident high-water mark (since the last reset_peak)."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024  # bytes on macOS, KiB elsewhere


def reset_peak() -> bool:
    """Reset the kernel's high-water mark (Linux: VmHWM) to the current RSS; False where that
    is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    hwm, now = _status_kib("VmHWM"), _status_kib("VmRSS")
    return hwm is not None and now is not None and hwm <= now + 1024


class Peak:
    """The peak RSS of the block it is entered for (`nbytes`, also readable inside it): the
    kernel's counter after a reset, or a sampling thread where no reset is possible (then
    `sampled` is True)."""

    def __init__(self, period: float = 0.001):
        self.period = period
        self.sampled = False
        self._peak, self._stop, self._thread = 0, None, None

    def __enter__(self) -> "Peak":
        self.sampled = not reset_peak()
        self._peak = rss()
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
            self._peak = max(self._peak, peak_rss())

    @property
    def nbytes(self) -> int:
        if self.sampled or self._thread is not None:
            return max(self._peak, rss())
        return max(self._peak, peak_rss())

    def _sample(self) -> None:
        while not self._stop.wait(self.period):
            self._peak = max(self._peak, rss())
