"""A thread that samples the process's live bytes (actcodec.resident.live: RSS less what the
allocators hold free) for their peak; and the readers of actcodec.resident the apps use."""
from __future__ import annotations

import threading
import time

from actcodec.resident import (heap, held_free, live, peak_rss, reset_peak,  # noqa: F401
                               rss)


class Sampler(threading.Thread):
    """The peak of live bytes (RSS less held_free) and of RSS, read every `period` seconds
    by this thread alone (it resets no counter, so it sees what the code it measures does
    not report); `take_rss()` ends one span of RSS readings and starts the next. live=False
    reads RSS alone (reading live bytes walks the allocators' free lists, which a step of
    mostly Python code feels at a millisecond's period)."""

    def __init__(self, period: float = 0.002, live: bool = True):
        super().__init__(daemon=True)
        self.period, self.peak_live, self.on = period, 0, False
        self.live = live
        self.span_rss = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            if self.on:
                if self.live:
                    self.peak_live = max(self.peak_live, live())
                self.span_rss = max(self.span_rss, rss())
            time.sleep(self.period)

    def take_rss(self) -> int:
        """The largest RSS read since the last call (or the start), and RSS now."""
        out, self.span_rss = max(self.span_rss, rss()), 0
        return out
